#!/usr/bin/env bash
# The Soft-RoCE test harness (tests/softroce): QEMU, busybox, rdma-core, libibverbs
# headers (the verbs transport is built only where they exist) and a cached kernel +
# initramfs under ~/.cache/netreduce/softroce (scripts/softroce/prepare.sh). Quick
# and idempotent when cached; needs root (apt-get), else says what is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then
  echo "env_softroce.sh: not root: the Soft-RoCE tests (tests/softroce) will be skipped" >&2
  exit 0
fi
had_verbs=0
[ -e /usr/include/infiniband/verbs.h ] && had_verbs=1
echo "env_softroce.sh: the Soft-RoCE guest: QEMU, busybox, rdma-core, ibverbs (apt-get where" \
     "missing) and a Debian kernel image, unpacked under ~/.cache/netreduce/softroce (once)"
bash "$here/softroce/prepare.sh" >/dev/null
if [ $had_verbs = 0 ] && [ -e /usr/include/infiniband/verbs.h ]; then
  # libibverbs-dev arrived just now: rebuild so the verbs transport is compiled in
  # (setup.py notices what it found changed and compiles every source again).
  echo "env_softroce.sh: libibverbs-dev is new: rebuilding netreduce's native module with the verbs transport"
  py=${PYTHON:-python3}
  (cd "$here/.." && flock /tmp/netreduce-build.lock $py -m pip install -q --no-build-isolation --no-deps -e .)
fi
