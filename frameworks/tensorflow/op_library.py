"""Build, cache and load the graph ops (kernels/collective_ops.cc).

The ops are compiled on first use, against the headers of the TensorFlow that is
running (``tf.sysconfig.get_compile_flags()/get_link_flags()``), into a cache
keyed by the TensorFlow version, its flags and the kernel source:
``NETREDUCE_TF_OP_CACHE`` (default ``~/.cache/netreduce/tf-ops``). Why not at
install time: a wheel is built once for every TensorFlow a user may pair it with,
and TensorFlow's C++ ABI changes between its releases; pip also builds wheels in
an isolated environment where TensorFlow is not importable. The cost: one C++17
compile of ~15 s (2 cores) the first time a process of a new TensorFlow version
builds a graph with a netreduce collective, and a C++ compiler on that machine
(``NETREDUCE_CXX``, default ``c++``), or a cache filled elsewhere:
``python -m netreduce.tensorflow.op_library`` builds it and prints its path.

Concurrent ranks wait for one build under a file lock instead of compiling N times.
Eager code never needs the library.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import List, Optional, Tuple

import tensorflow as tf

from netreduce import config
from netreduce.errors import NetReduceError

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "collective_ops.cc")
BUILD_TIMEOUT_S = 600.0


class OpLibraryError(NetReduceError):
    """The graph ops could not be built or loaded (no compiler, a failed compile)."""


def _flags() -> Tuple[List[str], List[str]]:
    # TensorFlow's headers as system headers: their own warnings are not ours.
    compile_flags = ["-isystem" + f[2:] if f.startswith("-I") else f
                     for f in tf.sysconfig.get_compile_flags()]
    return compile_flags, list(tf.sysconfig.get_link_flags())


def cache_dir() -> str:
    configured = config.get("NETREDUCE_TF_OP_CACHE")
    return configured or os.path.join(os.path.expanduser("~"), ".cache", "netreduce", "tf-ops")


def library_path() -> str:
    """Where this TensorFlow's build of the ops lives (built or not)."""
    with open(SOURCE, "rb") as f:
        source = f.read()
    compile_flags, link_flags = _flags()
    key = hashlib.sha256(b"\0".join([source, tf.__version__.encode(),
                                     " ".join(compile_flags + link_flags).encode()]))
    return os.path.join(cache_dir(),
                        f"netreduce_tf_ops-{tf.__version__}-{key.hexdigest()[:16]}.so")


def _compiler() -> List[str]:
    cxx = shlex.split(config.get("NETREDUCE_CXX") or "c++")
    if not cxx or shutil.which(cxx[0]) is None:
        raise OpLibraryError(
            f"netreduce.tensorflow needs a C++17 compiler ({' '.join(cxx) or 'c++'}: not found) "
            f"once per TensorFlow version, to build its graph ops for TensorFlow "
            f"{tf.__version__} (tf.function, Keras fit, TF1 sessions; eager calls need none): "
            "install one (Debian/Ubuntu: apt-get install g++) or set NETREDUCE_CXX, or build "
            "the cache where one exists with `python -m netreduce.tensorflow.op_library` "
            f"and copy {cache_dir()} here (NETREDUCE_TF_OP_CACHE)")
    return cxx


def build(path: str) -> None:
    """Compile the ops into ``path`` (atomically: a temporary file renamed)."""
    compile_flags, link_flags = _flags()
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    cmd = _compiler() + ["-std=c++17", "-shared", "-fPIC", "-O2", "-Wall",
                         *compile_flags, SOURCE, "-o", tmp, *link_flags]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise OpLibraryError(
                f"netreduce.tensorflow: building the graph ops for TensorFlow {tf.__version__} "
                f"failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-4000:]}")
        os.replace(tmp, path)
    except subprocess.TimeoutExpired:
        raise OpLibraryError(f"netreduce.tensorflow: building the graph ops took more than "
                             f"{BUILD_TIMEOUT_S:.0f} s: {' '.join(cmd)}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def ensure_built() -> str:
    """The library's path, built first if this TensorFlow has none in the cache."""
    path = library_path()
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(os.path.join(os.path.dirname(path), ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be building it right now
        if not os.path.exists(path):
            print(f"netreduce.tensorflow: building the graph ops for TensorFlow "
                  f"{tf.__version__} once (~15 s) into {path}", file=sys.stderr, flush=True)
            build(path)
    return path


class Library:
    """The loaded ops (``ops.netreduce_allreduce`` ...) and the bridge's C functions."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ops = tf.load_op_library(path)
        c = ctypes.CDLL(path)  # the same handle TensorFlow opened: same request queue
        i64, p = ctypes.c_int64, ctypes.POINTER
        c.nrtf_next.argtypes, c.nrtf_next.restype = [i64], i64
        c.nrtf_request.argtypes = [i64, p(ctypes.c_char_p), p(p(i64)), p(i64)]
        c.nrtf_request.restype = ctypes.c_int
        c.nrtf_allocate.argtypes = [i64, ctypes.c_int, ctypes.c_int, p(i64), p(ctypes.c_int)]
        c.nrtf_allocate.restype = i64
        c.nrtf_done.argtypes, c.nrtf_done.restype = [i64, ctypes.c_int, ctypes.c_char_p], None
        c.nrtf_stop.argtypes, c.nrtf_stop.restype = [], None
        c.nrtf_pending.argtypes, c.nrtf_pending.restype = [], i64
        c.nrtf_queued.argtypes, c.nrtf_queued.restype = [], i64
        self.c = c


_lock = threading.Lock()
_library: Optional[Library] = None


def load() -> Library:
    """The library, built and loaded once per process."""
    global _library
    with _lock:
        if _library is None:
            _library = Library(ensure_built())
        return _library


def loaded() -> Optional[Library]:
    return _library


def main(argv: Optional[List[str]] = None) -> int:
    print(ensure_built())
    return 0


if __name__ == "__main__":
    sys.exit(main())
