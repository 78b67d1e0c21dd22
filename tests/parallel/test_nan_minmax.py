"""Min and max with NaN and signed zeros as numpy has them (np.minimum / np.maximum:
NaN whichever rank holds it), on every path a job's data can take: flat through the
aggregator, NETREDUCE_DETERMINISTIC=1 (rank-order folding), the hierarchical
algorithm's shared memory (one host), and the host all-reduce of NETREDUCE_FALLBACK=host
(the ranks' in-process aggregators). Every float dtype, both ops, each rank holding
NaN in turn (tests/parallel/nan_worker.py); the kernels themselves, scalar and AVX2,
in tests/unit/test_kernels.py."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from netreduce.process import free_tcp_port
from tests.procs import collect

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "nan_worker.py")


def _launch(n: int, extra: dict) -> list:
    job = "nan-" + uuid.uuid4().hex[:8]
    procs = []
    for r in range(n):
        env = dict(os.environ, NETREDUCE_JOB=job, NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(n),
                   NETREDUCE_LOCAL_RANK=str(r), NETREDUCE_LOCAL_SIZE=str(n),
                   NETREDUCE_TIMEOUT="20", NETREDUCE_JOB_SECRET="s-" + job,
                   PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]), **extra)
        procs.append(subprocess.Popen([sys.executable, WORKER], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return collect(procs, 120)


@pytest.mark.parametrize("path,n,algorithm", [
    ("flat", 3, "flat"),
    ("deterministic", 2, "flat"),
    ("hierarchical", 2, "hierarchical"),
    ("host", 2, "failover"),
])
def test_nan_and_signed_zeros_on_every_path(switch, path, n, algorithm):
    address = f"{switch.address[0]}:{switch.address[1]}"
    extra = {"NETREDUCE_SWITCH": address, "NETREDUCE_ALGORITHM": "flat"}
    if path == "deterministic":
        extra["NETREDUCE_DETERMINISTIC"] = "1"
    elif path == "hierarchical":
        extra["NETREDUCE_ALGORITHM"] = "hierarchical"  # one host: shared memory only
    elif path == "host":  # no aggregator answers: the ranks' own, in process
        extra.update(NETREDUCE_SWITCH=f"127.0.0.1:{free_tcp_port()}", NETREDUCE_FALLBACK="host",
                     NETREDUCE_RENDEZVOUS=f"127.0.0.1:{free_tcp_port()}")
    results = _launch(n, extra)
    for r in results:
        assert r.get("returncode") == 0 and "failure" not in r, r
        assert r["checked"] == 8, r
        assert algorithm in r["algorithm"], r
        assert path != "host" or r["path_kind"] == "host", r
