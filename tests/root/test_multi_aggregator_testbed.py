"""Several aggregators across the emulated testbed: 3 ranks in 3 host namespaces,
2 or 3 netreduce-switch daemons in further host namespaces (each behind its own
shaped link), NETREDUCE_SWITCH=a,b[,c]. Every dtype x op x size exact against
numpy on every rank, identical bytes on every rank, and every aggregator's link
carried its share. Needs root; skipped with the reason otherwise."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from netreduce.testbed import Testbed, why_unusable
from tests.procs import collect_ok
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(REPO, "tests", "parallel", "multi_aggregator_worker.py")
RANKS = 3


@pytest.mark.parametrize("k", [2, 3])
def test_exact_over_aggregators_in_their_own_hosts(k):
    with Testbed(hosts=RANKS + k, rate="1gbit", name=scratch_testbed_name(f"m{k}")[:8],
                 subnet=scratch_subnet(), replace=True) as tb:
        daemons = []
        try:
            for i in range(k):
                node = tb.hosts[RANKS + i]
                daemons.append(tb.spawn_switch(node=node).proc)
            switch = ",".join(f"{tb.hosts[RANKS + i].address}:4791" for i in range(k))
            before = tb.counters()
            job = "tbm-" + uuid.uuid4().hex[:6]
            procs = []
            for r in range(RANKS):
                env = dict(os.environ, NETREDUCE_SWITCH=switch, NETREDUCE_JOB=job,
                           NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(RANKS),
                           NETREDUCE_TIMEOUT="30",
                           PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
                procs.append(tb.popen(r, [sys.executable, WORKER, "exact"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            results = collect_ok(procs, timeout=300)
            after = tb.counters()
        finally:
            for proc in daemons:
                proc.terminate()
                proc.wait(10)
        for r in results:
            assert "failure" not in r, r
            assert r["algorithm"] == "multi-aggregator" and r["aggregators"] == k, r
            assert r["checked"] == 72, r
        assert len({r["digest"] for r in results}) == 1
        rx = [after[f"h{RANKS + i}"]["rx_bytes"] - before[f"h{RANKS + i}"]["rx_bytes"]
              for i in range(k)]
        assert min(rx) > sum(rx) / k / 2, rx  # every aggregator carried its share
