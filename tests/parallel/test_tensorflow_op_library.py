"""netreduce.tensorflow's graph ops are compiled on first use into a per-TensorFlow
cache (op_library.py): without a compiler the first graph collective says what to do;
the cache path names the TensorFlow version; a filled cache needs no compiler."""
import importlib.util
import os
import subprocess
import sys

import pytest

from netreduce.environment import discover

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                       reason="tensorflow is not importable"),
    pytest.mark.skipif(discover().size > 1, reason="already running under a launcher"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import tensorflow as tf
import netreduce.tensorflow as hvd
from netreduce.tensorflow import op_library
hvd.init()
print("VERSION", tf.__version__)
print("PATH", op_library.library_path())
try:
    tf.function(lambda x: hvd.allreduce(x))(tf.ones([2]))
except op_library.OpLibraryError as exc:
    print("ERROR", str(exc).replace("\\n", " "))
else:
    print("BUILT")
"""


def _run(tmp_path, **env):
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", NETREDUCE_TF_OP_CACHE=str(tmp_path), **env)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, full.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=full,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout


def test_no_compiler_is_a_clear_error(tmp_path):
    out = _run(tmp_path, NETREDUCE_CXX="no-such-c++")
    version = next(line.split()[1] for line in out.splitlines() if line.startswith("VERSION"))
    assert f"netreduce_tf_ops-{version}-" in out
    error = next(line for line in out.splitlines() if line.startswith("ERROR"))
    assert "C++17 compiler" in error and "no-such-c++" in error
    assert "python -m netreduce.tensorflow.op_library" in error and str(tmp_path) in error


def test_a_filled_cache_needs_no_compiler(tmp_path):
    """`python -m netreduce.tensorflow.op_library` fills a cache (the suite's usual one:
    built once, by the first graph test); copied elsewhere, it loads with no compiler."""
    import shutil
    build = subprocess.run([sys.executable, "-m", "netreduce.tensorflow.op_library"],
                           cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=600)
    assert build.returncode == 0, build.stdout[-3000:]
    built = build.stdout.strip().splitlines()[-1]
    shutil.copy2(built, tmp_path / os.path.basename(built))
    assert "BUILT" in _run(tmp_path, NETREDUCE_CXX="no-such-c++")
