"""Several aggregators on loopback: 2 and 3 netreduce-switch daemons, N rank
processes through the public API with NETREDUCE_SWITCH=a,b[,c]. Every result is
exact (checked against numpy on every rank) and identical across ranks, every
aggregator carries traffic, and a killed aggregator gives every rank an error
naming its address within the timeout."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional

import pytest

from tests.procs import collect

from netreduce.algorithms.multi_aggregator import spread
from netreduce.protocol.address import parse_addresses

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "multi_aggregator_worker.py")


@pytest.fixture
def daemons(request):
    from netreduce.switch import spawn
    started = []

    def start(k: int):
        for _ in range(k):
            started.append(spawn(host="127.0.0.1", port=0))
        return started

    yield start
    for proc in started:
        proc.stop()


def launch(addresses: List[tuple], n: int, mode: str, arg: str = "", timeout: float = 180,
           extra: Optional[Dict[str, str]] = None, wait=None) -> List[dict]:
    job = "multi-" + uuid.uuid4().hex[:8]
    switch = ",".join(f"{h}:{p}" for h, p in addresses)
    procs = []
    for r in range(n):
        env = dict(os.environ, NETREDUCE_SWITCH=switch, NETREDUCE_JOB=job,
                   NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(n), NETREDUCE_TIMEOUT="8",
                   PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
        env.update(extra or {})  # may replace any of the above
        procs.append(subprocess.Popen([sys.executable, WORKER, mode, arg], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    if wait is not None:
        wait()
    return collect(procs, timeout)


@pytest.mark.parametrize("k, n", [(2, 3), (3, 2), (3, 4)])
def test_exact_and_identical_over_several_aggregators(daemons, k, n):
    procs = daemons(k)
    results = launch([p.address for p in procs], n, "exact")
    for r in results:
        assert r.get("returncode") == 0 and "failure" not in r, r
        assert r["algorithm"] == "multi-aggregator" and r["aggregators"] == k, r
        assert r["checked"] == 4 * 3 * 6, r
        st = r["stats"]
        # First sends only: resends and tail copies follow the host's scheduling.
        sent = [st[f"agg{i}_packets_sent"] - st[f"agg{i}_retransmits"] - st[f"agg{i}_tail_copies"]
                for i in range(k)]
        # equal shares of the large buffers: every aggregator within 2x of the mean
        assert min(sent) > sum(sent) / k / 2, r["stats"]
    assert len({r["digest"] for r in results}) == 1, "ranks ended with different bytes"


def test_killed_aggregator_is_named_on_every_rank(daemons, tmp_path):
    procs = daemons(2)
    flag = str(tmp_path / "go")
    n = 3

    def kill_when_ready():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                os.path.exists(f"{flag}.ready{r}") for r in range(n)):
            time.sleep(0.05)
        procs[1].proc.kill()
        procs[1].proc.wait()
        open(flag, "w").close()

    # the killed aggregator falls silent: the ranks name it after NETREDUCE_TIMEOUT
    results = launch([p.address for p in procs], n, "kill", flag, wait=kill_when_ready,
                     extra={"NETREDUCE_TIMEOUT": "4"})
    dead = f"{procs[1].address[0]}:{procs[1].address[1]}"
    for r in results:
        assert "failure" not in r, r
        assert dead in r["error"], r
        assert r["error_after_s"] < 4 + 10, r  # NETREDUCE_TIMEOUT=4, plus slack for 2 cores


def test_hierarchical_with_several_aggregators_is_refused(daemons):
    procs = daemons(2)
    results = launch([p.address for p in procs], 2, "exact",
                     extra={"NETREDUCE_ALGORITHM": "hierarchical"}, timeout=60)
    for r in results:
        assert r.get("returncode") != 0 or "failure" in r, r
        assert "not combined yet" in (r.get("failure", "") + r["stderr"]), r


def test_spread_covers_every_element_once():
    for count in (0, 1, 5, 65_536, 1_000_003):
        for weights in ([1, 1], [1, 1, 1], [2, 1, 1]):
            for call in range(3):
                parts = spread(count, 4, weights, call)
                covered = sorted((a, b) for _, a, b in parts)
                assert covered[0][0] == 0 and covered[-1][1] == count
                assert all(x[1] == y[0] for x, y in zip(covered, covered[1:]))
    big = spread(1 << 20, 4, [2, 1, 1], 0)
    assert [b - a for _, a, b in big] == [1 << 19, 1 << 18, 1 << 18]
    small = [spread(100, 4, [1, 1, 1], c)[0][0] for c in range(6)]
    assert small == [0, 1, 2, 0, 1, 2]  # whole, round-robin


def test_address_lists():
    assert parse_addresses("10.0.0.1,10.0.0.2:5000") == [("10.0.0.1", 4791), ("10.0.0.2", 5000)]
    with pytest.raises(ValueError, match="twice"):
        parse_addresses("10.0.0.1,10.0.0.1:4791")
    with pytest.raises(ValueError, match="empty item"):
        parse_addresses("10.0.0.1,")
