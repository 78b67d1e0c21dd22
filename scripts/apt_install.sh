# Sourced by the install scripts (install.sh, env_mxnet.sh): the one way they install
# the Debian packages they found missing.
#   apt_install WHO WITHOUT PACKAGE...
# As root with apt-get: says so (WHO: apt-get install ...) and installs them (an
# apt-get update that fails leaves them out and goes on; an install that fails stops
# the script under set -e). Otherwise says on stderr what is missing and WITHOUT: what
# goes without them. Nothing when no PACKAGE is given.
apt_install() {
    local who=$1 without=$2
    shift 2
    [ $# -gt 0 ] || return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "$who: apt-get install $* (Debian packages; a minute or more)"
        export DEBIAN_FRONTEND=noninteractive
        if apt-get update -qq; then
            apt-get install -y -qq "$@" >/dev/null
        fi
    else
        echo "$who: missing $* (not root: $without)" >&2
    fi
}
