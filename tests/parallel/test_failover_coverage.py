"""Failover beyond the flat global all-reduce (issue 14, docs/failover.md "limits"):

* process sets: their collectives go on, exact, across a SIGKILL of the primary
  aggregator (with failover on, their sub-jobs run at rank 0's in-process
  aggregator, which outlives any aggregator);
* the hierarchical algorithm (the default for hosts with several ranks): the
  aggregator SIGKILLed inside a multi-chunk all-reduce, the job goes on on the
  standby, exact.
"""
from __future__ import annotations

import pytest

from tests.parallel.test_failover import assert_exact, kill, launch, spawn_switch

pytestmark = pytest.mark.slow


def test_process_set_collectives_survive_a_sigkill_of_the_aggregator(tmp_path):
    with spawn_switch() as primary, spawn_switch() as standby:
        a = f"{primary.address[0]}:{primary.address[1]}"
        b = f"{standby.address[0]}:{standby.address[1]}"
        results = launch(tmp_path, 3, {"NETREDUCE_SWITCH": a, "NETREDUCE_STANDBY_SWITCH": b,
                                       "NETREDUCE_ALGORITHM": "flat"},
                         mode="psets", steps=8, on_mark=kill(primary, mid_transfer=True))
    assert_exact(results, 8)
    for r in results:
        assert r["stats"]["failovers"] == 1 and b in r["stats"]["path"], r["stats"]
