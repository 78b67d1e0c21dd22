#!/usr/bin/env bash
# Install the all-reduce implementations netreduce is benchmarked against.
#
#   torch.distributed (gloo)  - comes with torch (pip install torch)
#   Open MPI + mpi4py         - Debian openmpi-bin / libopenmpi-dev, pip mpi4py
#   Horovod 0.28.1 with Gloo  - scripts/env_horovod.sh: built from PyPI's sdist once
#                               (~4 minutes on 2 cores), then installed from a cached
#                               wheel under ~/.cache/netreduce/wheels in seconds
#
# Idempotent: each step does nothing when its peer is already importable.
# CI (scripts/install.sh test) runs scripts/env_horovod.sh itself.
set -euo pipefail

HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-2}

need() { command -v "$1" >/dev/null 2>&1 || { echo "setup_peers: '$1' not found; $2" >&2; exit 1; }; }

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "setup_peers: torch is not installed; install it first (pip install torch)" >&2
    exit 1
fi

if ! "$PYTHON" -c "import mpi4py" 2>/dev/null; then
    need mpicc "install Debian's openmpi-bin and libopenmpi-dev first"
    echo "setup_peers: installing mpi4py"
    "$PYTHON" -m pip install mpi4py
fi

# Horovod: scripts/env_horovod.sh builds it once into a cached wheel (the recipe,
# with its C++17 patch, lives there; the test suite's setup runs it too).
PYTHON="$PYTHON" JOBS="$JOBS" HOROVOD_VERSION="$HOROVOD_VERSION" \
    bash "$(dirname "$0")/../scripts/env_horovod.sh"
