"""The PyTorch examples, run the way their docstrings say (netreduce-run -np 2), with
the smallest settings on which the loss still clearly falls. Each script exits
non-zero unless the loss fell and every rank ends with identical weights; the test
also reads the summary line rank 0 prints and checks those claims itself."""
import functools
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from netreduce.environment import discover  # noqa: E402
from tests.peers import require_horovodrun  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = ["--epochs", "2", "--samples", "1024"]
RUNS = {
    "horovod-api": ["examples/pytorch_train.py"],
    "ddp-netreduce-backend": ["examples/pytorch_ddp.py"],
    "ddp-gloo-allreduce-hook": ["examples/pytorch_ddp.py", "--backend", "gloo", "--hook"],
}
SUMMARY = re.compile(r"loss (\d+\.\d+) -> (\d+\.\d+) \((fell|DID NOT FALL)\).*weights "
                     r"identical on all (\d+) ranks: (True|False) \(([0-9a-f]{16})\)")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")]


@functools.lru_cache(maxsize=None)
def _run(which: str):
    env = dict(os.environ, NETREDUCE_TIMEOUT="20", OMP_NUM_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for var in ("NETREDUCE_SWITCH", "NETREDUCE_RANK", "NETREDUCE_SIZE", "NETREDUCE_JOB",
                "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(var, None)
    script, *options = RUNS[which]
    cmd = [sys.executable, "-m", "netreduce.launcher", "-np", "2", "--", sys.executable,
           os.path.join(ROOT, script), *options, *ARGS]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    return proc.returncode, proc.stdout


def _check_summary(out: str) -> str:
    """The example's last words: the loss fell over two epochs and every rank ended
    with the same weights; returns their digest."""
    summaries = SUMMARY.findall(out)
    assert len(summaries) == 1, out[-4000:]  # rank 0 prints it, once
    first, last, verdict, ranks, identical, digest = summaries[0]
    assert float(last) < float(first) and verdict == "fell", summaries[0]
    assert ranks == "2" and identical == "True", summaries[0]
    epochs = re.findall(r"epoch (\d+): loss", out)
    assert epochs == ["0", "1"], out[-4000:]
    return digest


@pytest.mark.parametrize("which", sorted(RUNS))
def test_example_trains(which):
    rc, out = _run(which)
    assert rc == 0, out[-4000:]
    _check_summary(out)


def test_examples_reach_the_same_weights():
    """Same data, seeds and hyper-parameters: the Horovod API, DDP on the netreduce
    backend and DDP with allreduce_hook must end with bit-identical weights. With two
    ranks, averaging is exact whether done as (a + b) / 2 or a / 2 + b / 2, so any
    difference means a gradient was reduced differently (or not at all)."""
    digests = {}
    for which in RUNS:
        rc, out = _run(which)
        assert rc == 0, out[-4000:]
        digests[which] = SUMMARY.findall(out)[0][5]
    assert len(set(digests.values())) == 1, digests


HOROVOD_IMPORT = "import netreduce.torch as hvd  # <- the one line a Horovod user changes\n"


@pytest.mark.slow
def test_horovod_api_example_runs_under_horovodrun(tmp_path):
    """Issue 4: examples/pytorch_train.py runs unchanged under real Horovod once its one
    import line is swapped, i.e. it uses no netreduce-only API."""
    horovodrun = require_horovodrun()  # fails under CI when Horovod is missing
    with open(os.path.join(ROOT, RUNS["horovod-api"][0])) as f:
        lines = f.readlines()
    assert lines.count(HOROVOD_IMPORT) == 1, "the example's netreduce import line changed"
    copy = tmp_path / "pytorch_train_horovod.py"
    copy.write_text("".join("import horovod.torch as hvd\n" if line == HOROVOD_IMPORT else line
                            for line in lines))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in list(env):
        if var.startswith(("NETREDUCE_", "HOROVOD_")) or var in (
                "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
            env.pop(var)
    cmd = [horovodrun, "-np", "2", "--gloo", "-H", "localhost:2", "--gloo-timeout-seconds", "60",
           sys.executable, str(copy), *RUNS["horovod-api"][1:], *ARGS]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    digest = _check_summary(out)  # horovodrun prefixes lines with "[0]<stdout>:"
    # Same data and seeds, exact two-rank averages: real Horovod and netreduce must
    # end with bit-identical weights.
    rc, ours = _run("horovod-api")
    assert rc == 0, ours[-4000:]
    assert digest == SUMMARY.findall(ours)[0][5]
