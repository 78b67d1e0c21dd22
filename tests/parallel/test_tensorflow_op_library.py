"""netreduce.tensorflow's graph ops are compiled on first use into a per-TensorFlow
cache (op_library.py): without a compiler the first graph collective says what to do;
the cache path names the TensorFlow version; a filled cache needs no compiler.

TensorFlow's import is most of each process's time, so the module runs two processes,
side by side: `python -m netreduce.tensorflow.op_library` (fills the usual cache) and
one TensorFlow process that first meets an empty cache with no compiler, then (once
the command is done and its library copied to a second, empty cache) the filled copy,
still with no compiler. op_library reads its knobs at each load and keeps no failed
load, so the second attempt in the same process is a first load from the copy."""
import importlib.util
import os
import shutil
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

# argv: the empty cache, the cache the filled library is copied to, the file whose
# appearance says that copy is done (it holds "ok", or why there is nothing to load).
SCRIPT = """
import os, sys, time
import tensorflow as tf
import netreduce.tensorflow as hvd
from netreduce.tensorflow import op_library
empty, filled, go = sys.argv[1:4]

def collective(cache):
    os.environ["NETREDUCE_TF_OP_CACHE"] = cache
    os.environ["NETREDUCE_CXX"] = "no-such-c++"
    print("PATH", op_library.library_path(), flush=True)
    try:
        tf.function(lambda x: hvd.allreduce(x))(tf.ones([2]))
    except op_library.OpLibraryError as exc:
        print("ERROR", str(exc).replace("\\n", " "), flush=True)
    else:
        print("BUILT", flush=True)

hvd.init()
print("VERSION", tf.__version__, flush=True)
collective(empty)
print("SECOND", flush=True)
deadline = time.monotonic() + 600
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
if open(go).read().strip() == "ok":
    collective(filled)
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the no-compiler process's output before and after SECOND, the build command's
    process); the two TensorFlow processes run at the same time."""
    base = tmp_path_factory.mktemp("tf_ops")
    empty, filled, go = base / "empty", base / "filled", base / "go"
    empty.mkdir()
    filled.mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("NETREDUCE_TF_OP_CACHE", None)  # the command fills the usual cache
    build = subprocess.Popen([sys.executable, "-m", "netreduce.tensorflow.op_library"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    env = dict(env, PYTHONPATH=os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p))
    probe = subprocess.Popen([sys.executable, "-c", SCRIPT, str(empty), str(filled), str(go)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        built_out, _ = build.communicate(timeout=600)
        built = built_out.strip().splitlines()[-1] if built_out.strip() else ""
        if build.returncode == 0 and os.path.isfile(built):
            shutil.copy2(built, filled / os.path.basename(built))
            go.write_text("ok\n")
        else:
            go.write_text(f"the build command failed (exit {build.returncode})\n")
        out, _ = probe.communicate(timeout=300)
    finally:
        for proc in (build, probe):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert probe.returncode == 0, out[-3000:]
    first, _, second = out.partition("\nSECOND\n")
    return first, second, built_out, build.returncode, str(empty)


def test_no_compiler_is_a_clear_error(runs):
    out, _, _, _, empty = runs
    version = next(line.split()[1] for line in out.splitlines() if line.startswith("VERSION"))
    assert f"netreduce_tf_ops-{version}-" in out
    error = next(line for line in out.splitlines() if line.startswith("ERROR"))
    assert "C++17 compiler" in error and "no-such-c++" in error
    assert "python -m netreduce.tensorflow.op_library" in error and empty in error


def test_a_filled_cache_needs_no_compiler(runs):
    """`python -m netreduce.tensorflow.op_library` fills a cache (the suite's usual one:
    built once, by the first graph test); copied elsewhere, it loads with no compiler."""
    _, second, built_out, returncode, _ = runs
    assert returncode == 0, built_out[-3000:]
    assert "BUILT" in second.splitlines(), second[-3000:]
