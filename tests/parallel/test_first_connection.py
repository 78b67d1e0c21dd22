"""A rank's first connection to its aggregator is tried again while nothing listens
there yet (netreduce-run starts the ranks beside the aggregator, not after it), up
to NETREDUCE_START_TIMEOUT; then the error names the address and the limit. And
netreduce-run, when the aggregator it started beside the ranks never listens, says
so and stops them."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

from netreduce.switch.child import free_aggregator_port, spawn
from netreduce.testbed import proc_stat

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RANK = textwrap.dedent("""
    import os, sys
    import numpy as np
    import netreduce as nr
    open(os.path.join(sys.argv[1], os.environ["NETREDUCE_RANK"]), "w").close()
    nr.init()
    x = nr.allreduce(np.full(4, nr.rank() + 1, np.float32), op=nr.Sum)
    print("sum", x[0], flush=True)
    nr.shutdown()
""")


def _ranks(n, port, marks, **knobs):
    job = "first-" + uuid.uuid4().hex[:8]
    procs = []
    for r in range(n):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   NETREDUCE_SWITCH=f"127.0.0.1:{port}", NETREDUCE_JOB=job,
                   NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(n), NETREDUCE_LOCAL_RANK=str(r),
                   NETREDUCE_LOCAL_SIZE=str(n), **knobs)
        env.pop("NETREDUCE_JOB_SECRET", None)
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(marks)], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _wait_marks(marks, n, within=60.0):
    deadline = time.monotonic() + within
    while len(os.listdir(marks)) < n:
        assert time.monotonic() < deadline, "ranks did not start"
        time.sleep(0.02)


def test_ranks_started_before_their_aggregator_join_once_it_listens(tmp_path):
    port = free_aggregator_port("127.0.0.1", 2)
    procs = _ranks(2, port, tmp_path, NETREDUCE_START_TIMEOUT="60")
    try:
        _wait_marks(tmp_path, 2)  # both about to dial: nothing listens on the port
        time.sleep(1.0)
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        with spawn(port=port):
            outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.split() for o, _ in outs] == [["sum", "3.0"]] * 2


def test_a_rank_whose_aggregator_never_listens_names_it_and_the_limit(tmp_path):
    port = free_aggregator_port("127.0.0.1", 2)
    t0 = time.monotonic()
    [proc] = _ranks(1, port, tmp_path, NETREDUCE_START_TIMEOUT="1.5")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert f"127.0.0.1:{port}" in err and "1.5 s" in err and "NETREDUCE_START_TIMEOUT" in err, err
    assert time.monotonic() - t0 >= 1.5  # it asked again until the limit, not once


def test_netreduce_run_stops_the_ranks_when_its_aggregator_does_not_start(tmp_path):
    code = ("import os, sys, time; open(os.path.join(sys.argv[1], os.environ['NETREDUCE_RANK']), "
            "'w').write(str(os.getpid())); time.sleep(60)")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NETREDUCE_SWITCH", None)
    proc = subprocess.run([sys.executable, "-m", "netreduce.launcher", "-np", "2",
                           "--switch-arg=--no-such-flag", sys.executable, "-c", code,
                           str(tmp_path)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=90)
    assert proc.returncode == 1, proc.stderr
    assert "the job's aggregator did not start" in proc.stderr, proc.stderr
    assert "--no-such-flag" in proc.stderr, proc.stderr  # the daemon's command
    for name in os.listdir(tmp_path):  # a rank that got as far as its first line is gone
        with open(tmp_path / name) as f:
            pid = int(f.read() or 0)
        # gone or a zombie (an empty file: killed between its open and its write)
        assert not (pid and proc_stat.alive(pid)), pid
