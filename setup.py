"""Build netreduce: the pure-Python core, the framework adapters and the native
extension ``netreduce._native`` (C++17, pybind11, -O3, no -march=native: the SIMD
reduction kernels pick their instruction set at run time)."""
import glob
import json
import os
import shutil
import subprocess
import sys

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


# frameworks/<name> is installed as netreduce.<name> (docs/design.md: thin adapters).
FRAMEWORKS = {
    "netreduce.torch": "frameworks/torch",
    "netreduce.tensorflow": "frameworks/tensorflow",
    "netreduce.mxnet": "frameworks/mxnet",
}
ADAPTERS = [n for n, p in FRAMEWORKS.items() if os.path.exists(os.path.join(HERE, p, "__init__.py"))]
# ... with every subpackage (netreduce.tensorflow.keras): package_dir maps the adapter's
# folder, but only the packages listed are installed. An editable install hides a
# missing one (it maps the whole folder); tests/parallel/test_wheel.py installs the wheel.
ADAPTER_PACKAGES = ADAPTERS + [f"{n}.{sub}" for n in ADAPTERS
                               for sub in find_packages(os.path.join(HERE, FRAMEWORKS[n]))]
# Files an adapter reads at run time: netreduce.tensorflow compiles its graph ops from
# this source on first use (frameworks/tensorflow/op_library.py).
ADAPTER_DATA = {"netreduce.tensorflow": ["kernels/*.cc"]}


def _pkg_config(*args):
    """pkg-config's answer (``$PKG_CONFIG`` if set), or None where it has none."""
    try:
        out = subprocess.run([os.environ.get("PKG_CONFIG", "pkg-config"), *args],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.split()


INCLUDE_DIRS, LIBRARY_DIRS = [], []  # what pkg-config says the found libraries need


def _found(package, header):
    """Whether a library's headers are here: pkg-config's ``package`` (its include and
    library folders join the build's), else, for a library that ships no .pc file or a
    machine without pkg-config, ``header`` in the compiler's default folders."""
    flags = _pkg_config("--cflags", "--libs-only-L", package)
    if flags is not None:
        INCLUDE_DIRS.extend(f[2:] for f in flags if f.startswith("-I") and f[2:] not in INCLUDE_DIRS)
        LIBRARY_DIRS.extend(f[2:] for f in flags if f.startswith("-L") and f[2:] not in LIBRARY_DIRS)
        return True
    return any(os.path.exists(os.path.join(d, header)) for d in ("/usr/include", "/usr/local/include"))


# The verbs transport (native/transport/verbs) needs libibverbs' headers (Debian
# libibverbs-dev); without them it is left out and `netreduce info` says so.
HAVE_VERBS = _found("libibverbs", "infiniband/verbs.h")
# libdeflate (Debian libdeflate-dev) computes the RoCEv2 ICRC with PCLMULQDQ, about 14x
# zlib 1.2's CRC-32 (native/wire/roce.cc); without it zlib's is used.
HAVE_LIBDEFLATE = _found("libdeflate", "libdeflate.h")
# ISA-L (Debian libisal-dev) folds with VPCLMULQDQ on AVX-512: 2.3x libdeflate at
# 1432 B, 3.7x at 8936 B; preferred over libdeflate where both are found.
HAVE_ISAL = _found("libisal", "isa-l/crc.h")
# The one the ICRC uses: (library to link, macro native/wire/roce.cc tests), or none.
CRC32 = (("isal", "NETREDUCE_HAVE_ISAL") if HAVE_ISAL else
         ("deflate", "NETREDUCE_HAVE_LIBDEFLATE") if HAVE_LIBDEFLATE else None)

# The AF_XDP transport (native/transport/xdp) needs libxdp's and libbpf's headers
# (Debian libxdp-dev, libbpf-dev) and clang for its XDP program (xdp_steer.bpf.c,
# compiled with -target bpf and embedded in the module); without them it is left
# out and `netreduce info` / `netreduce-switch --transport xdp` say so.
XDP_HEADERS = {"libxdp": "xdp/xsk.h", "libbpf": "bpf/libbpf.h"}
CLANG = shutil.which("clang")
XDP_FOUND = {package: _found(package, header) for package, header in XDP_HEADERS.items()}
HAVE_XDP = all(XDP_FOUND.values()) and CLANG is not None
XDP_SOURCE = os.path.join("native", "transport", "xdp", "xdp_steer.bpf.c")


def _say_what_is_left_out():
    """A build without an optional dependency still works; say what it lacks and the
    Debian package that brings it (scripts/install.sh installs them all)."""
    missing = []
    if not HAVE_ISAL:
        missing.append("ISA-L (ICRC with " + ("libdeflate's" if HAVE_LIBDEFLATE else "zlib's")
                       + " slower CRC-32): libisal-dev")
    if not HAVE_LIBDEFLATE and not HAVE_ISAL:
        missing.append("libdeflate (ICRC with zlib's slower CRC-32): libdeflate-dev")
    if not HAVE_XDP:
        lacks = [XDP_HEADERS[p] for p, ok in XDP_FOUND.items() if not ok] + ([] if CLANG else ["clang"])
        missing.append("the AF_XDP transport (no " + ", ".join(lacks) + "): libxdp-dev libbpf-dev clang")
    if not HAVE_VERBS:
        missing.append("the verbs transport (no infiniband/verbs.h): libibverbs-dev")
    for m in missing:
        print(f"netreduce: building without {m}", file=sys.stderr)


def native_config(sources=None):
    """What a build of the extension compiles in, as found on this machine: the
    optional libraries (verbs, AF_XDP, the CRC-32's), its sources, macros and
    libraries. Recorded beside the build's objects (config_changed)."""
    return {"verbs": HAVE_VERBS, "xdp": HAVE_XDP, "crc32": CRC32[0] if CRC32 else "zlib",
            "sources": sorted(sources if sources is not None else native_sources()),
            "folders": INCLUDE_DIRS + LIBRARY_DIRS,  # pkg-config's, for the libraries found
            "python": sys.version.split()[0]}


def config_changed(stamp, config):
    """None when ``stamp`` (a JSON file) records ``config``; otherwise what changed, in
    words, and ``stamp`` now records ``config``. setuptools rebuilds an extension only
    when a source is newer than it: installing libibverbs-dev (or libxdp, ISA-L)
    between two ``pip install .`` changes what the sources compile to, not their
    dates, so the build in build/ was reused and the new transport silently left out."""
    try:
        with open(stamp) as f:
            before = json.load(f)
    except (OSError, ValueError):
        before = None
    if before == config:
        return None
    if before is None:
        why = "no record of what the native objects in build/ were compiled with"
    else:
        names = {"verbs": "the verbs transport (libibverbs-dev)",
                 "xdp": "the AF_XDP transport (libxdp-dev, libbpf-dev, clang)",
                 "crc32": "the ICRC's CRC-32 library", "sources": "the native sources",
                 "python": "the Python version", "folders": "the libraries' folders"}
        changes = []
        for key in sorted(set(before) | set(config)):
            if before.get(key) != config.get(key):
                old, new = before.get(key), config.get(key)
                if isinstance(new, bool):
                    changes.append(f"{names.get(key, key)} {'found' if new else 'gone'}")
                elif key in ("sources", "folders"):
                    changes.append(names[key] + " changed")
                else:
                    changes.append(f"{names.get(key, key)}: {old} -> {new}")
        why = "since the last build, " + "; ".join(changes)
    os.makedirs(os.path.dirname(stamp) or ".", exist_ok=True)
    with open(stamp, "w") as f:
        json.dump(config, f, indent=1)
    return why


def native_sources():
    found = glob.glob(os.path.join("native", "**", "*.cc"), recursive=True)
    if not HAVE_VERBS:
        found = [f for f in found if os.sep + os.path.join("transport", "verbs") + os.sep not in f]
    if not HAVE_XDP:
        found = [f for f in found if os.sep + os.path.join("transport", "xdp") + os.sep not in f]
    return sorted(found)


def _multiarch_include():
    """/usr/include/<triplet>, where Debian keeps asm/types.h, which the BPF target
    (no host triplet of its own) does not search."""
    try:
        triplet = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True,
                                 check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        triplet = ""
    return [f"-I/usr/include/{triplet}"] if triplet else []


class BuildExt(build_ext):
    """Compiles the XDP program to a BPF object and embeds it in the extension as a
    byte array (build_temp/xdp/xdp_steer_object.h), so the module needs no file at
    run time.

    NETREDUCE_PREBUILT_NATIVE=<path of a built netreduce/_native*.so>: package that
    file instead of compiling the extension again. For the test suite's wheel
    (tests/installed.py), built from the checkout whose editable install has just
    compiled it: what the wheel test checks is what ships (packages, package data,
    entry points), and a second native compile would add minutes to CI."""

    def build_extensions(self):
        _say_what_is_left_out()
        stamp = os.path.join(self.build_temp, "netreduce_native_config.json")
        why = config_changed(stamp, native_config())
        target = self.get_ext_fullpath("netreduce._native")
        built = os.path.exists(target)
        if why and built and not self.force:  # (a first build compiles everything anyway)
            print(f"netreduce: {why}: compiling every native source again", file=sys.stderr)
            self.force = True  # build_ext rebuilds the extension, not only newer sources
        inputs = [f for e in self.extensions for f in list(e.sources) + list(e.depends)]
        if self.force or not built or any(os.path.getmtime(f) > os.path.getmtime(target)
                                          for f in inputs if os.path.exists(f)):
            print(f"netreduce: compiling the native module ({len(native_sources())} C++ "
                  "files; about a minute on 2 cores)", file=sys.stderr)
        if HAVE_XDP:
            out_dir = os.path.join(self.build_temp, "xdp")
            os.makedirs(out_dir, exist_ok=True)
            obj = os.path.join(out_dir, "xdp_steer.bpf.o")
            subprocess.run([CLANG, "-O2", "-g", "-target", "bpf", "-Wall", *_multiarch_include(),
                            "-I", os.path.dirname(XDP_SOURCE), "-c", XDP_SOURCE, "-o", obj],
                           check=True)
            strip = shutil.which("llvm-strip")
            if strip:  # DWARF is not needed at load time, the BTF sections are kept
                subprocess.run([strip, "-g", obj], check=True)
            with open(obj, "rb") as f:
                data = f.read()
            rows = [", ".join(str(b) for b in data[i:i + 24]) for i in range(0, len(data), 24)]
            header = ("// Generated by setup.py from " + XDP_SOURCE + "; do not edit.\n"
                      "#pragma once\nstatic const unsigned char kXdpSteerObject[] = {\n" +
                      ",\n".join(rows) + "\n};\n")
            path = os.path.join(out_dir, "xdp_steer_object.h")
            if not os.path.exists(path) or open(path).read() != header:
                with open(path, "w") as f:
                    f.write(header)
            for e in self.extensions:
                e.include_dirs.append(out_dir)
        super().build_extensions()

    def build_extension(self, ext):
        prebuilt = os.environ.get("NETREDUCE_PREBUILT_NATIVE")
        if prebuilt and ext.name == "netreduce._native":
            dest = self.get_ext_fullpath(ext.name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(prebuilt, dest)
            return
        super().build_extension(ext)


ext = Pybind11Extension(
    "netreduce._native",
    native_sources(),
    include_dirs=["native", *INCLUDE_DIRS],
    library_dirs=LIBRARY_DIRS,
    cxx_std=17,
    extra_compile_args=["-O3", "-fvisibility=hidden", "-Wall", "-Wno-unused-function", "-fwrapv"],
    libraries=["z"] + (["ibverbs"] if HAVE_VERBS else []) + ([CRC32[0]] if CRC32 else [])
    + (["xdp", "bpf"] if HAVE_XDP else []),
    define_macros=([("NETREDUCE_HAVE_VERBS", "1")] if HAVE_VERBS else [])
    + ([(CRC32[1], "1")] if CRC32 else [])
    + ([("NETREDUCE_HAVE_XDP", "1")] if HAVE_XDP else []),
    # every header too: build_ext rebuilds only when an input is newer than the module,
    # and a change to a header alone (engine/nap.h) otherwise left a stale module
    depends=[XDP_SOURCE, *sorted(glob.glob(os.path.join("native", "**", "*.h"), recursive=True))],
)


def main():
    # Compile the native sources on every core (35 files: a cold build takes about 50 s
    # on 2 cores, 85 s of CPU). NPY_NUM_BUILD_JOBS=<n> sets how many.
    ParallelCompile("NPY_NUM_BUILD_JOBS", default=0).install()
    setup(
        name="netreduce",
        version="0.1.0",
        description="In-network aggregation all-reduce for distributed deep-learning training",
        python_requires=">=3.9",
        packages=find_packages(include=["netreduce", "netreduce.*"]) + ADAPTER_PACKAGES,
        package_dir={name: path for name, path in FRAMEWORKS.items() if name in ADAPTERS},
        package_data={"netreduce": ["_native.pyi", "py.typed"],
                      **{n: files for n, files in ADAPTER_DATA.items() if n in ADAPTERS}},
        ext_modules=[ext],
        cmdclass={"build_ext": BuildExt},
        # prometheus_client: netreduce-switch --metrics-port (pure Python, no dependencies).
        # msgspec: the control protocol's schema (netreduce/protocol/messages.py)
        install_requires=["numpy>=1.21", "prometheus_client>=0.20", "cryptography>=3.1",
                          "msgspec>=0.18"],
        extras_require={
            # import-linter: the layer contracts (pyproject.toml, scripts/check_imports.py)
            # cryptography (a core dependency too): the TLS tests make a throwaway CA with it.
            "test": ["pytest>=7", "hypothesis>=6", "pytest-timeout", "import-linter>=2.13",
                     "cryptography>=3.1"],
            "torch": ["torch"],
            # TensorFlow and MXNet cannot share numpy (>=1.26 vs <1.24): scripts/env_*.sh
            # give each its own environment; these extras are what a user installs.
            "tensorflow": ["tensorflow-cpu>=2.16"],
            "mxnet": ["mxnet==1.9.1", "numpy<1.24"],
            "bench": ["matplotlib", "mpi4py"],
            # scripts/lint.py (pinned: a new release brings new findings; bump on purpose)
            "lint": ["ruff==0.17.6", "mypy==2.4.1"],
            # Ray Train's TorchTrainer (netreduce.torch.ray_train) and RayExecutor
            "ray": ["ray[train]>=2.40"],
            # netreduce.planner (GRID-style routing: the LP is solved by scipy's HiGHS)
            "planner": ["scipy>=1.9", "pyyaml"],
        },
        entry_points={
            "console_scripts": [
                "netreduce-switch=netreduce.switch:main",
                "netreduce-run=netreduce.launcher:main",
                "netreduce-testbed=netreduce.testbed.cli:main",
                "netreduce=netreduce.cli:main",
            ]
        },
        zip_safe=False,
    )


if __name__ == "__main__":  # (tests/unit/test_build_config.py imports the functions above)
    main()
