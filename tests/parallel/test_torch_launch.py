"""Start the multi-rank PyTorch tests under netreduce-run with 2 and 3 ranks.

Each rank runs the same pytest session (test_torch.py, test_torch_optimizer.py,
test_torch_distributed.py) in the same order, as Horovod runs its test/parallel files
under horovodrun; a failure on any rank makes the launcher exit non-zero."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from netreduce.environment import discover  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FILES = ["test_torch.py", "test_torch_optimizer.py", "test_torch_distributed.py",
         "test_torch_reducescatter.py", "test_torch_allgather.py", "test_torch_process_sets.py"]


@pytest.mark.slow
@pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")
@pytest.mark.parametrize("ranks", [2, 3])
def test_torch_suite(ranks):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("NETREDUCE_TIMEOUT", "20")
    env["OMP_NUM_THREADS"] = "1"  # N ranks share the host's cores
    cmd = [sys.executable, "-m", "netreduce.launcher", "-np", str(ranks), "--",
           sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           "-W", "ignore::FutureWarning",  # torch's all_gather_into_tensor rename notice
           *[os.path.join(HERE, f) for f in FILES]]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:]
    # every rank ran the suite, not a skip of it
    passed = [int(n) for n in re.findall(r"(\d+) passed", proc.stdout)]
    assert len(passed) == ranks and min(passed) >= 40, proc.stdout[-3000:]
