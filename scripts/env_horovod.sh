#!/usr/bin/env bash
# The Horovod peer the test suite compares against (run by `scripts/install.sh test`,
# and by benchmarks/setup_peers.sh): Horovod 0.28.1 built with Gloo for PyTorch.
#
# Horovod 0.28.1 predates torch 2.x's C++17 headers: its CMake files ask for C++14
# and the torch extension then fails to compile. We patch CMAKE_CXX_STANDARD to 17 in
# the top-level and horovod/torch CMakeLists.txt and build without MPI (Gloo only),
# TensorFlow or MXNet. The build takes ~4.5 minutes on 2 cores, so it is done once:
# the wheel is kept under ~/.cache/netreduce/wheels/, keyed by the Horovod, torch and
# Python versions it was built for (Horovod's torch extension is tied to torch's ABI),
# and later runs install that wheel in seconds.
#
# A no-op when `import horovod.torch` already works.
#   PYTHON=python3 bash scripts/env_horovod.sh
# Knobs: HOROVOD_VERSION (0.28.1), JOBS (2, build parallelism),
#        NETREDUCE_CACHE (~/.cache/netreduce).
set -euo pipefail

HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-2}
cache=${NETREDUCE_CACHE:-$HOME/.cache/netreduce}/wheels

say() { echo "env_horovod: $*"; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "env_horovod: '$1' not found; $2" >&2; exit 1; }; }

if "$PYTHON" -c "import horovod.torch" 2>/dev/null; then
    say "horovod.torch already importable: $("$PYTHON" -c 'import horovod; print(horovod.__version__)')"
    exit 0
fi
if ! torch_version=$("$PYTHON" -c "import torch; print(torch.__version__)" 2>/dev/null); then
    echo "env_horovod: torch is not installed for $PYTHON; install it first (scripts/install.sh main)" >&2
    exit 1
fi
py_tag=$("$PYTHON" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
key="horovod-$HOROVOD_VERSION-torch-${torch_version//+/_}-$py_tag"
wheel_dir="$cache/$key"
# horovod's own runtime dependencies (horovodrun needs cloudpickle, psutil, pyyaml).
runtime_deps=(cloudpickle psutil pyyaml packaging)

build_wheel() {
    local missing=()
    command -v cmake >/dev/null 2>&1 || missing+=(cmake)
    command -v g++ >/dev/null 2>&1 || missing+=(g++)
    if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "apt-get install ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    need cmake "install cmake (Debian: apt-get install cmake)"
    need g++ "install a C++17 compiler (Debian: apt-get install g++)"
    local work src log
    work=$(mktemp -d /tmp/nr-horovod.XXXXXX)
    # shellcheck disable=SC2064  # expand $work now: it is local to this function
    trap "rm -rf '$work'" EXIT

    say "fetching horovod==$HOROVOD_VERSION sdist"
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
    tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"

    # torch >= 2.1 headers need C++17; Horovod 0.28.1 pins 14.
    local f
    for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
        if grep -q 'CMAKE_CXX_STANDARD' "$f"; then
            sed -i -E 's/set\(CMAKE_CXX_STANDARD[[:space:]]+1[14]\)/set(CMAKE_CXX_STANDARD 17)/' "$f"
        else
            sed -i '1i set(CMAKE_CXX_STANDARD 17)' "$f"
        fi
        grep -n 'CMAKE_CXX_STANDARD' "$f" | sed "s|^|env_horovod: ${f#"$work"/}: |"
    done
    # Some CMake code paths append -std=c++14 explicitly.
    grep -rl -- '-std=c++14' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt" 2>/dev/null \
        | xargs -r sed -i 's/-std=c++14/-std=c++17/g' || true

    say "building the horovod wheel (gloo, torch; no MPI/TF/MXNet) with -j$JOBS; ~4.5 min on 2 cores"
    log="$work/build.log"
    mkdir -p "$work/wheel"
    if ! (
        cd "$src"
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$JOBS" \
            "$PYTHON" -m pip wheel --no-build-isolation --no-deps -v -w "$work/wheel" . >"$log" 2>&1
    ) then
        tail -n 60 "$log" >&2
        echo "env_horovod: horovod build failed (last 60 lines above)" >&2
        exit 1
    fi
    grep -E '^\[ *100%\]|Created wheel' "$log" | sed 's/^/env_horovod: /' || true
    # Publish atomically: a build interrupted half-way leaves no wheel in the cache.
    mkdir -p "$cache"
    rm -rf "$wheel_dir.tmp"
    mv "$work/wheel" "$wheel_dir.tmp"
    rm -rf "$wheel_dir"
    mv "$wheel_dir.tmp" "$wheel_dir"
    rm -rf "$work"
    trap - EXIT
}

shopt -s nullglob
wheels=("$wheel_dir"/horovod-*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
    build_wheel
    wheels=("$wheel_dir"/horovod-*.whl)
else
    say "using the cached wheel ${wheels[0]}"
fi
"$PYTHON" -m pip install -q --no-deps "${wheels[0]}"
"$PYTHON" -m pip install -q "${runtime_deps[@]}"

"$PYTHON" -c "import horovod.torch as hvd; import horovod; print('env_horovod: horovod', horovod.__version__, 'gloo built:', hvd.gloo_built())"
