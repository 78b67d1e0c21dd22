#!/usr/bin/env bash
# Install the all-reduce implementations netreduce is benchmarked against.
#
#   torch.distributed (gloo)  - comes with torch (pip install torch)
#   Open MPI + mpi4py         - Debian openmpi-bin / libopenmpi-dev, pip mpi4py
#   Horovod 0.28.1 with Gloo  - built here from PyPI's sdist
#
# Horovod 0.28.1 predates torch 2.x's C++17 headers: its CMake files ask for C++14
# and the torch extension then fails to compile. We patch CMAKE_CXX_STANDARD to 17 in
# the top-level and horovod/torch CMakeLists.txt and build without MPI (Gloo only),
# TensorFlow or MXNet. Takes ~4.5 minutes on 2 cores.
#
# Idempotent: does nothing when `import horovod.torch` already works.
# This is a benchmark setup step, not part of CI.
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

if "$PYTHON" -c "import horovod.torch" 2>/dev/null; then
    echo "setup_peers: horovod.torch already importable: $("$PYTHON" -c 'import horovod; print(horovod.__version__)')"
    exit 0
fi

need cmake "install cmake (Debian: apt-get install cmake)"
need g++ "install a C++17 compiler (Debian: apt-get install g++)"

work=$(mktemp -d /tmp/nr-horovod.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "setup_peers: fetching horovod==$HOROVOD_VERSION sdist"
"$PYTHON" -m pip download --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
src="$work/horovod-$HOROVOD_VERSION"

# torch >= 2.1 headers need C++17; Horovod 0.28.1 pins 14.
for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    if grep -q 'CMAKE_CXX_STANDARD' "$f"; then
        sed -i -E 's/set\(CMAKE_CXX_STANDARD[[:space:]]+1[14]\)/set(CMAKE_CXX_STANDARD 17)/' "$f"
    else
        sed -i '1i set(CMAKE_CXX_STANDARD 17)' "$f"
    fi
    grep -n 'CMAKE_CXX_STANDARD' "$f" | sed "s|^|setup_peers: ${f#$work/}: |"
done
# Some CMake code paths append -std=c++14 explicitly.
grep -rl -- '-std=c++14' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt" 2>/dev/null \
    | xargs -r sed -i 's/-std=c++14/-std=c++17/g' || true

echo "setup_peers: building horovod (gloo, torch; no MPI/TF/MXNet) with -j$JOBS"
log="$work/build.log"
if ! (
    cd "$src"
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$JOBS" \
        "$PYTHON" -m pip install --no-build-isolation --no-deps -v . >"$log" 2>&1
) then
    tail -n 60 "$log" >&2
    echo "setup_peers: horovod build failed (last 60 lines above)" >&2
    exit 1
fi
grep -E '^\[ *100%\]|Successfully installed' "$log" | sed 's/^/setup_peers: /' || true
# horovod's own runtime dependencies (horovodrun needs cloudpickle, psutil, pyyaml).
"$PYTHON" -m pip install cloudpickle psutil pyyaml packaging

"$PYTHON" -c "import horovod.torch as hvd; import horovod; print('setup_peers: horovod', horovod.__version__, 'gloo built:', hvd.gloo_built())"
