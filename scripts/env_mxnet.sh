#!/usr/bin/env bash
# MXNet's own environment (run by `scripts/install.sh test`): a virtualenv with
# mxnet 1.9.1 and numpy 1.23.5, and netreduce installed editable from this checkout.
#
# mxnet 1.9.1 (the last release) imports only with numpy < 1.24 (it uses np.bool,
# removed in 1.24; apache/mxnet#21165), so it cannot share the main environment's
# numpy 2. The tests in the main environment start MXNet ranks with this venv's python
# (tests/parallel/mxnet_env.py finds it).
#
# Idempotent: the venv is kept under ~/.cache/netreduce/venv-mxnet (CI caches
# ~/.cache/netreduce) and its packages are installed once, recorded by a stamp file
# naming their versions; every run then only re-installs netreduce editable from the
# current checkout (the in-place netreduce/_native .so, built for the same CPython and
# using no numpy C API, is shared with the main environment: packaged as it is when
# nothing in native/ or setup.py is newer, else rebuilt under the project's build lock).
#   PYTHON=python3 bash scripts/env_mxnet.sh
# Knobs: NETREDUCE_CACHE (~/.cache/netreduce).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
venv=${NETREDUCE_CACHE:-$HOME/.cache/netreduce}/venv-mxnet
pins=("numpy==1.23.5" "mxnet==1.9.1" "pytest>=7" "pytest-timeout" "pybind11>=2.12"
      "setuptools>=64" wheel)
stamp="$venv/.netreduce-stamp"
want="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])') ${pins[*]}"

say() { echo "env_mxnet: $*"; }
. scripts/apt_install.sh

# libmxnet.so links the system's OpenMP and quadmath runtimes (the wheel brings its
# own openblas and libgfortran.so.3); the rest is glibc and libstdc++.
missing=()
known=$(ldconfig -p)
for lib in libgomp.so.1:libgomp1 libquadmath.so.0:libquadmath0 libstdc++.so.6:libstdc++6; do
    grep -qF "${lib%%:*}" <<<"$known" || missing+=("${lib##*:}")
done
apt_install env_mxnet "mxnet will not import" "${missing[@]}"

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "creating $venv (${pins[*]})"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "${pins[@]}"
    echo "$want" >"$stamp"
else
    say "venv up to date: $venv"
fi

# netreduce from this checkout, every run (the checkout moves; the venv stays), with
# the core's own small dependencies (install_requires) but never a numpy other than
# the pinned one; --no-build-isolation: build with the venv's setuptools and pybind11.
# The native module the main environment's install has just built in place is packaged
# as is (NETREDUCE_PREBUILT_NATIVE, setup.py) when it is there: an editable build
# compiles in a fresh temporary folder and would otherwise compile every source again
# (45 s of the test command on 2 cores).
echo "numpy==1.23.5" >"$venv/constraints.txt"
suffix=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
prebuilt="$PWD/netreduce/_native$suffix"
if [ -e "$prebuilt" ] && [ -z "$(find native setup.py -newer "$prebuilt" -print -quit)" ]; then
    export NETREDUCE_PREBUILT_NATIVE="$prebuilt"
fi
flock /tmp/netreduce-build.lock \
    "$venv/bin/python" -m pip install -q --no-build-isolation -c "$venv/constraints.txt" -e .

"$venv/bin/python" - <<'EOF'
import mxnet, numpy
import netreduce._native  # the shared in-place build loads under numpy 1.x too
import netreduce.mxnet
print(f"env_mxnet: mxnet {mxnet.__version__}, numpy {numpy.__version__}, netreduce.mxnet "
      f"from {netreduce.mxnet.__file__}")
EOF
