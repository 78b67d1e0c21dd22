"""Start the multi-rank TensorFlow tests under netreduce-run with 2 and 3 ranks.

Each rank runs one pytest session over test_tensorflow.py and test_tensorflow_keras.py
(TensorFlow is imported once per rank: its import is the slow part on a small host). A
failure on any rank makes the launcher exit non-zero. `scripts/install.sh test`
installs TensorFlow (scripts/env_tensorflow.sh), so under CI (CI=true) a missing
TensorFlow is a broken install and fails here; elsewhere the test skips with the reason."""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from netreduce.environment import discover
from tests.peers import in_ci

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FILES = ["test_tensorflow.py", "test_tensorflow_keras.py"]
HINT = "run `bash scripts/env_tensorflow.sh` (scripts/install.sh test does)"


def _require_tensorflow() -> None:
    if importlib.util.find_spec("tensorflow") and importlib.util.find_spec("keras"):
        return
    if in_ci():
        pytest.fail(f"tensorflow/keras are not importable: CI must run the TensorFlow "
                    f"tests; {HINT}", pytrace=False)
    pytest.skip(f"tensorflow/keras are not importable; {HINT}")


@pytest.mark.slow
@pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")
@pytest.mark.parametrize("ranks", [2, 3])
def test_tensorflow_suite(ranks):
    _require_tensorflow()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("NETREDUCE_TIMEOUT", "30")
    env["OMP_NUM_THREADS"] = "1"  # N ranks share the host's cores
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"  # TensorFlow's own start-up chatter
    cmd = [sys.executable, "-m", "netreduce.launcher", "-np", str(ranks), "--",
           sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           *[os.path.join(HERE, f) for f in FILES]]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:]
    # every rank ran the suite, not a skip of it
    passed = [int(n) for n in re.findall(r"(\d+) passed", proc.stdout)]
    assert len(passed) == ranks and min(passed) >= 29, proc.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")
def test_keras_example_under_netreduce_run():
    """examples/tensorflow_keras.py: both paths end with identical weights on every
    rank and a falling loss (the example exits non-zero otherwise)."""
    _require_tensorflow()
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.setdefault("NETREDUCE_TIMEOUT", "30")
    cmd = [sys.executable, "-m", "netreduce.launcher", "-np", "2", "--", sys.executable,
           os.path.join(ROOT, "examples", "tensorflow_keras.py"), "--samples", "768",
           "--epochs", "3"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for path in ("DistributedOptimizer", "Strategy"):
        assert re.search(rf"{path}: loss .* identical on all 2 ranks: True", proc.stdout), \
            proc.stdout[-3000:]
