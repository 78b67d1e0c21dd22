"""Start the multi-rank TensorFlow tests under netreduce-run with 2 and 3 ranks.

Each rank runs one pytest session over the FILES (TensorFlow is imported once per
rank: its import is the slow part on a small host). A failure on any rank makes the
launcher exit non-zero. The ranks run netreduce as users install it: from the wheel
of this checkout in a venv, outside the source tree (tests/installed.py), so a
package or file the wheel does not ship fails here. `scripts/install.sh test`
installs TensorFlow (scripts/env_tensorflow.sh), so under CI (CI=true) a missing
TensorFlow is a broken install and fails here; elsewhere the test skips with the reason."""
import importlib.util
import os
import re
import subprocess
import time

import pytest

from netreduce.environment import discover
from tests.peers import in_ci

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FILES = ["test_tensorflow.py", "test_tensorflow_collectives.py", "test_tensorflow_graph.py",
         "test_tensorflow_keras.py"]
HINT = "run `bash scripts/env_tensorflow.sh` (scripts/install.sh test does)"


def _require_tensorflow() -> None:
    if importlib.util.find_spec("tensorflow") and importlib.util.find_spec("keras"):
        return
    if in_ci():
        pytest.fail(f"tensorflow/keras are not importable: CI must run the TensorFlow "
                    f"tests; {HINT}", pytrace=False)
    pytest.skip(f"tensorflow/keras are not importable; {HINT}")


def _env(installed):
    env = dict(installed.env)
    env.setdefault("NETREDUCE_TIMEOUT", "30")
    env["OMP_NUM_THREADS"] = "1"  # N ranks share the host's cores
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"  # TensorFlow's own start-up chatter
    return env


def _launch(installed, ranks, *command, timeout=900):
    cmd = [installed.python, "-m", "netreduce.launcher", "-np", str(ranks), "--",
           installed.python, *command]
    return subprocess.run(cmd, cwd=installed.cwd, env=_env(installed), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")
# Three ranks (an odd world: uneven splits, orders that differ by rank); two ranks are
# Horovod's own suite's size (benchmarks/horovod_suite, np 2) and the other launch tests'.
# Each job costs ~37 s here (TensorFlow imported in every rank), so only one size runs.
@pytest.mark.parametrize("ranks", [3])
def test_tensorflow_suite(ranks, installed):
    _require_tensorflow()
    here = os.path.join(installed.tests, "parallel")
    proc = _launch(installed, ranks, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                   *[os.path.join(here, f) for f in FILES])
    assert proc.returncode == 0, proc.stdout[-6000:]
    # every rank ran the suite, not a skip of it
    passed = [int(n) for n in re.findall(r"(\d+) passed", proc.stdout)]
    assert len(passed) == ranks and min(passed) >= 62, proc.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")
# Two ranks already hold the two orders (even ranks forwards, odd ranks backwards), which
# is what a blocking kernel deadlocks on; a third rank (forwards again) only adds a
# TensorFlow start (the odd world is the suite's, above).
@pytest.mark.parametrize("ranks", [2])
def test_collectives_never_wait_for_an_inter_op_thread(ranks, installed):
    """tests/parallel/tf_order_worker.py: independent collectives issued in an order
    that differs by rank, more of them than TensorFlow has inter-op threads (one),
    in a tf.function and in a TF1 Session, complete."""
    _require_tensorflow()
    proc = _launch(installed, ranks, os.path.join(installed.tests, "parallel",
                                                  "tf_order_worker.py"), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert proc.stdout.count("order worker: ok") == ranks, proc.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")
def test_elastic_run_survives_an_aggregator_restart(installed, tmp_path):
    """tests/parallel/tf_elastic_worker.py under hvd.elastic.run: the aggregator is
    SIGKILLed after a commit and a new one started on its port; every rank rolls back
    to the commit, rejoins, syncs from rank 0 and ends with the uninterrupted run's
    weights, after exactly one reset."""
    _require_tensorflow()
    from netreduce.switch import spawn
    marker, restarted = tmp_path / "committed", tmp_path / "restarted"
    switch = spawn(host="127.0.0.1", port=0)
    port = switch.address[1]
    env = _env(installed)
    env["NETREDUCE_TIMEOUT"] = "10"
    cmd = [installed.python, "-m", "netreduce.launcher", "-np", "2", "--switch",
           f"127.0.0.1:{port}", "--", installed.python,
           os.path.join(installed.tests, "parallel", "tf_elastic_worker.py"),
           str(marker), str(restarted)]
    proc = subprocess.Popen(cmd, cwd=installed.cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    second = None
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "no rank reached the break point"
        switch.proc.kill()  # the aggregator dies without a word
        switch.proc.wait()
        second = spawn(host="127.0.0.1", port=port)
        restarted.write_text("up\n")
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        switch.stop()
        if second is not None:
            second.stop()
    assert proc.returncode == 0, out[-5000:]
    assert out.count("elastic worker: ok (rank") == 2, out[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")
def test_keras_example_under_netreduce_run(installed):
    """examples/tensorflow_keras.py: both paths end with identical weights on every
    rank and a falling loss (the example exits non-zero otherwise)."""
    _require_tensorflow()
    proc = _launch(installed, 2, os.path.join(ROOT, "examples", "tensorflow_keras.py"),
                   "--samples", "768", "--epochs", "3", timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for path in ("DistributedOptimizer", "Strategy"):
        assert re.search(rf"{path}: loss .* identical on all 2 ranks: True", proc.stdout), \
            proc.stdout[-3000:]
    # ... and says only that: none of TensorFlow's C++ start-up log (was 33 of 35 lines).
    noise = [ln for ln in proc.stdout.splitlines()
             if re.match(r"(\[\d+\]<std\w+>:)?([IW]\d{4} |WARNING: All log messages before absl)", ln)]
    assert not noise, noise[:5]
