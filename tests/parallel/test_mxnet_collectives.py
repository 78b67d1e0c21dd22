"""netreduce.mxnet's allgather, alltoall, reducescatter (plain and grouped) and process
sets under netreduce-run with 2 and 3 ranks, in MXNet's environment: every rank runs
tests/parallel/mxnet_collective_ranks.py with the venv's python."""
import os
import re
import subprocess
import sys

import pytest

from netreduce.environment import discover
from tests.parallel.mxnet_env import ROOT, mxnet_python, rank_env

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")]


@pytest.mark.parametrize("ranks", [2, 3])
def test_mxnet_collectives(ranks):
    python = mxnet_python()
    cmd = [sys.executable, "-m", "netreduce.launcher", "-np", str(ranks), "--", python, "-m",
           "pytest", "-q", "-x", "-p", "no:cacheprovider",
           os.path.join(ROOT, "tests", "parallel", "mxnet_collective_ranks.py")]
    proc = subprocess.run(cmd, cwd=ROOT, env=rank_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-6000:]
    passed = [int(n) for n in re.findall(r"(\d+) passed", proc.stdout)]
    assert len(passed) == ranks and min(passed) >= 40, proc.stdout[-3000:]
    assert "skipped" not in proc.stdout, proc.stdout[-3000:]
