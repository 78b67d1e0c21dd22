"""Ranks started by Open MPI's mpirun (not by netreduce-run): rank and size come
from OMPI_COMM_WORLD_*, the aggregator from NETREDUCE_SWITCH, the job name from
the launch's PMIx namespace. This file is also the worker (see __main__)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker() -> None:
    import netreduce as nr
    from netreduce import environment
    topo = environment.discover()
    assert topo.launcher == "openmpi", topo
    nr.init()
    r, n = nr.rank(), nr.size()
    assert (r, n) == (topo.rank, topo.size) and nr.local_size() == n
    out = nr.allreduce(np.full(100_000, r, np.float32), op=nr.Sum, name="x")
    assert (out == n * (n - 1) / 2).all()
    assert nr.allgather_object(r) == list(range(n))
    nr.shutdown()
    # Written to a file, not stdout: Open MPI's output forwarding can lose the
    # last line of a rank that exits right after printing it (seen once in CI).
    with open(os.path.join(os.environ["NR_TEST_OUT"], f"rank{r}"), "w") as f:
        f.write(f"OK {r} {topo.job}\n")


import pytest  # noqa: E402


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpirun") is None,
                    reason="needs Open MPI's mpirun (Debian package openmpi-bin)")
@pytest.mark.parametrize("size", [2, 3])
def test_ranks_under_mpirun(switch, size, tmp_path):
    host, port = switch.address
    env = dict(os.environ, NETREDUCE_SWITCH=f"{host}:{port}", NETREDUCE_TIMEOUT="20",
               NR_TEST_OUT=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for var in ("NETREDUCE_RANK", "NETREDUCE_SIZE", "NETREDUCE_JOB"):
        env.pop(var, None)
    cmd = ["mpirun", "--oversubscribe", "-np", str(size), "-x", "NETREDUCE_SWITCH",
           "-x", "NETREDUCE_TIMEOUT", "-x", "PYTHONPATH", "-x", "NR_TEST_OUT"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    proc = subprocess.run(cmd + [sys.executable, os.path.abspath(__file__)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    oks = sorted(p.read_text().split() for p in tmp_path.iterdir())
    assert [int(o[1]) for o in oks] == list(range(size))
    assert len({o[2] for o in oks}) == 1 and oks[0][2].startswith("mpi-")


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    worker()
