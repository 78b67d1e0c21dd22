"""netreduce.mxnet under netreduce-run with 2 and 3 ranks, in MXNet's environment.

Each rank runs tests/parallel/mxnet_ranks.py (KVStore pushpull/broadcast across
dtypes and shapes, gluon.Trainer with kvstore="netreduce" and mx.kv.create, the
summing semantics, the Horovod API and DistributedTrainer, shape mismatches) with the
venv's python; the launcher and aggregator are this environment's."""
import os
import re
import subprocess
import sys

import pytest

from netreduce.environment import discover
from tests.parallel.mxnet_env import ROOT, mxnet_python, rank_env, run_ranks_file

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")]


@pytest.mark.parametrize("ranks", [2, 3])
def test_mxnet_suite(ranks):
    run_ranks_file("mxnet_ranks.py", ranks, at_least=17, timeout=300)


SUMMARY = re.compile(r"loss (\d+\.\d+) -> (\d+\.\d+) \((fell|DID NOT FALL)\).*weights "
                     r"identical on all (\d+) ranks: (True|False)")


@pytest.mark.parametrize("trainer", ["kvstore", "horovod"])
def test_example_gluon_trains(trainer):
    """examples/mxnet_gluon.py as its docstring runs it (2 ranks, fewer samples): the
    loss falls and every rank ends with the same weights."""
    python = mxnet_python()
    cmd = [sys.executable, "-m", "netreduce.launcher", "-np", "2", "--", python,
           os.path.join(ROOT, "examples", "mxnet_gluon.py"), "--trainer", trainer,
           "--epochs", "2", "--samples", "1024"]
    proc = subprocess.run(cmd, cwd=ROOT, env=rank_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:]
    summaries = SUMMARY.findall(proc.stdout)
    assert len(summaries) == 1, proc.stdout[-4000:]
    first, last, verdict, ranks, identical = summaries[0]
    assert float(last) < float(first) and verdict == "fell", summaries[0]
    assert ranks == "2" and identical == "True", summaries[0]
