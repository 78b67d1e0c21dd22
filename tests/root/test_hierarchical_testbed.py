"""The hierarchical all-reduce across the emulated testbed: several hosts (network
namespaces, shaped 1 Gbit/s links) with two ranks each, the aggregator in its own
namespace. Local ranks share memory inside their namespace; local rank l of every
host is rank h of the aggregator sub-job for shard l. Needs root and the built
native module; skipped with the reason otherwise."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Dict, List, Optional

import pytest

from netreduce.testbed import Testbed, why_unusable
from tests.procs import collect
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(REPO, "tests", "parallel", "hierarchical_worker.py")


def run_job(tb, switch, per_host: List[int], mode: str, arg: str = "",
            extra: Optional[Dict[str, str]] = None, timeout: float = 180) -> List[dict]:
    """per_host[h] ranks on host h (ranks numbered host by host), as a launcher would
    place them; returns each rank's JSON line (or its exit status and stderr)."""
    job = "tbh-" + uuid.uuid4().hex[:6]
    host, port = switch.address
    n = sum(per_host)
    procs, rank = [], 0
    for h, count in enumerate(per_host):
        for lr in range(count):
            env = dict(os.environ, NETREDUCE_SWITCH=f"{host}:{port}", NETREDUCE_JOB=job,
                       NETREDUCE_RANK=str(rank), NETREDUCE_SIZE=str(n),
                       NETREDUCE_LOCAL_RANK=str(lr), NETREDUCE_LOCAL_SIZE=str(count),
                       NETREDUCE_TIMEOUT="30",
                       PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
                       **(extra or {}))
            procs.append(tb.popen(h, [sys.executable, WORKER, mode, arg], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            rank += 1
    return collect(procs, timeout)


def check(results: List[dict], checked: int, hosts: List[List[int]]) -> None:
    for r in results:
        assert r.get("returncode") == 0, r
        assert "failure" not in r, r
        assert r["algorithm"] == "hierarchical" and r["hosts"] == hosts, r
        assert r["checked"] == checked, r
        assert r["segment_mapped"] is False, r
    assert len({r["digest"] for r in results}) == 1, "ranks ended with different bytes"


@pytest.mark.parametrize("hosts", [2, 3])
def test_two_ranks_per_host(native, hosts):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    layout = [[2 * h, 2 * h + 1] for h in range(hosts)]
    with Testbed(hosts=hosts, rate="1gbit", name=scratch_testbed_name("h"),
                 subnet=scratch_subnet(), replace=True) as tb:
        switch = tb.spawn_switch(env=env)
        try:
            # Sizes 0, 1, odd, across packets and (4 KiB shards) across many chunks.
            check(run_job(tb, switch, [2] * hosts, "pattern",
                          extra={"NETREDUCE_SHM_CHUNK": "4096"}), 22, layout)
            # Every dtype x op, values whose sums do not depend on the hosts' order.
            check(run_job(tb, switch, [2] * hosts, "random", "exact"), 18, layout)
            if hosts == 2:
                check(run_job(tb, switch, [2, 2], "big", timeout=300), 1, layout)
        finally:
            switch.stop()


def test_sigkill_and_uneven_hosts(native):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    with Testbed(hosts=2, rate="1gbit", name=scratch_testbed_name("k"),
                 subnet=scratch_subnet(), replace=True) as tb:
        switch = tb.spawn_switch(env=env)
        try:
            results = run_job(tb, switch, [2, 2], "kill", "3", timeout=120)
            assert results[3]["returncode"] == -9, results[3]
            for res in results[:3]:
                assert res.get("returncode") == 0 and res["error"] and "rank 3" in res["error"], res
                assert res["seconds"] < 30, res
            # Two ranks on h0, one on h1: auto runs flat, forced hierarchical is refused.
            flat = run_job(tb, switch, [2, 1], "pattern")
            assert [r["algorithm"] for r in flat] == ["flat"] * 3, flat
            assert all(r["returncode"] == 0 and "failure" not in r for r in flat), flat
            forced = run_job(tb, switch, [2, 1], "pattern",
                             extra={"NETREDUCE_ALGORITHM": "hierarchical"}, timeout=90)
            for r in forced:
                assert r["returncode"] != 0 and "same number of ranks on every host" in r["stderr"], r
        finally:
            switch.stop()
