#!/usr/bin/env bash
# Install netreduce and what its examples (main) or its test suite (test) need,
# on a fresh Debian machine. Idempotent: what is there already is skipped. The
# README's "What the install commands install" lists all of it (kept in step by
# tests/unit/test_install_script.py); each step says what it does before it starts.
#   bash scripts/install.sh main    # the package + PyTorch (CPU)
#   bash scripts/install.sh test    # + the test suite's tools, peers and frameworks
set -euo pipefail
what=${1:-main}
cd "$(dirname "$0")/.."
say() { echo "install.sh: $*"; }
. scripts/apt_install.sh

apt_pkgs=()
need() { command -v "$1" >/dev/null 2>&1 || apt_pkgs+=("$2"); }
if [ "$what" = test ]; then
  need tshark tshark
  need mpirun openmpi-bin
  [ -e /usr/include/x86_64-linux-gnu/mpi.h ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || apt_pkgs+=(libopenmpi-dev)
  need nft nftables
  need ip iproute2
  need tc iproute2
  need iperf3 iperf3
  # tests/root: the sending veth's UDP segmentation offload off (GSO capture test)
  need ethtool ethtool
  # tests/root/test_launch_ssh.py: sshd in the testbed's host namespaces (netreduce-run -H)
  [ -x /usr/sbin/sshd ] || apt_pkgs+=(openssh-server)
  # tests/root/test_slurm.py: a real Slurm (slurmctld, a slurmd per host namespace) and munge
  { [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v srun >/dev/null; } || \
    apt_pkgs+=(slurm-wlm)
  [ -x /usr/sbin/munged ] || apt_pkgs+=(munge)
  # scripts/sanitizers.sh: ASan/UBSan builds and libFuzzer (compiler-rt)
  need clang++ clang
  ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || \
    apt_pkgs+=(libclang-rt-dev)
  # scripts/lint.py: the native code's format and bug-pattern checks (native/.clang-*)
  need clang-format clang-format
  need clang-tidy clang-tidy
fi
# What setup.py compiles in where it finds it (each left out otherwise, and `netreduce
# info` says so): the build itself needs only a C++17 compiler, Python's headers and zlib.
need g++ g++
[ -e /usr/include/zlib.h ] || apt_pkgs+=(zlib1g-dev)
# the ICRC's CRC-32 with PCLMULQDQ (without it zlib's, slower at MTU 1500)
[ -e /usr/include/libdeflate.h ] || apt_pkgs+=(libdeflate-dev)
# ... faster still with ISA-L's (VPCLMULQDQ), preferred where both are there
[ -e /usr/include/isa-l/crc.h ] || apt_pkgs+=(libisal-dev)
# The AF_XDP transport (native/transport/xdp, netreduce-switch --transport xdp):
# libxdp/libbpf headers and libraries, clang for its XDP program (-target bpf; the
# kernel's UAPI headers come with linux-libc-dev), xdp-tools to inspect what is
# attached (xdp-loader status).
[ -e /usr/include/xdp/xsk.h ] || apt_pkgs+=(libxdp-dev)
[ -e /usr/include/bpf/libbpf.h ] || apt_pkgs+=(libbpf-dev)
[ -e /usr/include/linux/bpf.h ] || apt_pkgs+=(linux-libc-dev)
need clang clang
need xdp-loader xdp-tools
# The verbs transport (native/transport/verbs, docs/verbs.md): libibverbs' headers.
[ -e /usr/include/infiniband/verbs.h ] || apt_pkgs+=(libibverbs-dev)
# (apt_install says "install.sh: apt-get install ..." before it starts)
apt_install install.sh "tests that need them will be skipped" "${apt_pkgs[@]}"

py=${PYTHON:-python3}
into=$($py -c 'import sys; print(sys.prefix)')
# torch is pinned: the CPU wheel for 2.13.0; a looser pin pulls a multi-GB CUDA build.
say "pip install torch 2.13.0 (CPU), pybind11, setuptools, wheel into $into (a large download the first time)"
$py -m pip install -q "torch==2.13.0" "pybind11>=2.12" "setuptools>=64" wheel
extras=torch
[ "$what" = test ] && extras="torch,test,bench,planner,lint"
# Where ccache is installed (and no compiler was chosen), the native module goes through
# it: a clean clone of sources compiled before (CI's, a second checkout) then builds in
# seconds. CCACHE_BASEDIR makes the checkout's own paths relative, so clones share it.
# pip's editable build compiles in a new temporary folder each time (setuptools'
# editable_wheel), and setup.py puts its generated XDP header there (-I/tmp/tmpXXXX.build-
# temp/xdp) on every source's command line: that random path made every direct-mode
# lookup miss, so each of the ~40 sources was preprocessed again (~5 s of CPU) to find
# its hit. Left out of the hash, 40 of 41 hit directly; the one source that includes the
# header still gets the header's content hashed (its path is in the manifest).
build_env=()
if command -v ccache >/dev/null 2>&1 && [ -z "${CC:-}${CXX:-}" ]; then
  export CC="ccache gcc" CXX="ccache g++" CCACHE_BASEDIR="$PWD"
  export CCACHE_IGNOREOPTIONS="${CCACHE_IGNOREOPTIONS:+$CCACHE_IGNOREOPTIONS }-I/tmp/tmp*"
  # ccache hashes the path of every header outside CCACHE_BASEDIR, and pybind11's lie in
  # the environment's site-packages: every new virtualenv (CI's) missed the five binding
  # sources (native/python/, ~100 CPU-s of pybind11 templates) and looked up the other 36
  # by preprocessing them. So they compile against a copy of those headers under the
  # cache, keyed by their content (the same copy for every environment with the same
  # pybind11), found first (-I in CPPFLAGS comes before setup.py's); the environment's
  # own pybind11 and include folders, which then supply no header, stay out of the hash.
  pybind11_inc=$($py -c 'import pybind11; print(pybind11.get_include())')
  key=$(cd "$pybind11_inc" && find . -type f | LC_ALL=C sort | xargs -d '\n' sha256sum | sha256sum)
  stable=${NETREDUCE_CACHE:-$HOME/.cache/netreduce}/pybind11-include/${key:0:16}
  if [ ! -d "$stable" ]; then
    mkdir -p "$(dirname "$stable")"
    tmp=$(mktemp -d "$stable.XXXXXX")
    # published whole or not at all (mv -T of a folder is one rename; it fails, and the
    # copy goes, where another install has just published the same one)
    { cp -R "$pybind11_inc/." "$tmp/" && mv -T "$tmp" "$stable" 2>/dev/null; } || rm -rf "$tmp"
  fi
  if [[ "$stable$pybind11_inc$into" != *" "* ]]; then  # (ccache's option list is space-separated)
    export CCACHE_IGNOREOPTIONS="$CCACHE_IGNOREOPTIONS -I$pybind11_inc -I$into/include"
    build_env=(CPPFLAGS="-I$stable${CPPFLAGS:+ $CPPFLAGS}")
  fi
fi
say "pip install -e .[$extras]: netreduce's dependencies, then its native module (about a minute to compile on 2 cores)"
env "${build_env[@]}" $py -m pip install -q --no-build-isolation -e ".[$extras]"

if [ "$what" = test ]; then
  # Every test is time-bounded (pyproject.toml) and the TLS tests make their own CA:
  # fail here, not as a hang or a skip, if the test extra did not bring them.
  $py -c "import pytest_timeout, cryptography.x509"
  # The control-port fuzz harness (fuzz/control_fuzzer.py)
  $py -c "import atheris" 2>/dev/null || { say "pip install atheris"; $py -m pip install -q atheris; }
  # Ray Train for tests/parallel/test_ray.py (pinned: 2.60 adds only its own
  # packages beside torch 2.13 and TensorFlow, upgrading none of theirs)
  $py -c "import ray.train.torch" 2>/dev/null || \
    { say "pip install ray[train] 2.60.0"; $py -m pip install -q "ray[train]==2.60.0"; }
  # torchvision's models for Horovod's elastic example (tests/parallel/test_elastic_examples.py)
  # and the elastic benchmark: 0.28.0 is the release for torch 2.13, --no-deps so that it
  # cannot replace the CPU torch (its wheel is the CUDA build: docs/elastic.md says how
  # its models still load on CPU)
  $py -m pip show -q torchvision >/dev/null 2>&1 || \
    { say "pip install torchvision 0.28.0 (--no-deps), pillow"; \
      $py -m pip install -q --no-deps "torchvision==0.28.0" pillow; }
  # The peers the tests compare against, and one environment per framework group
  # that cannot share this one's numpy (each script caches what it builds under
  # ~/.cache/netreduce and is a no-op when its environment is already complete).
  for env_script in scripts/env_*.sh; do
    [ -e "$env_script" ] || continue
    say "$env_script (says what it installs; a no-op when it is there)"
    PYTHON=$py bash "$env_script"
  done
fi
say "done ($what); \`netreduce info\` says what the native module was built with"
