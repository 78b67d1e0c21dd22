"""Failover beyond the flat global all-reduce (issue 14, docs/failover.md "limits"):

* process sets: their collectives go on, exact, across a SIGKILL of the primary
  aggregator (with failover on, their sub-jobs run at rank 0's in-process
  aggregator, which outlives any aggregator);
* the hierarchical algorithm (the default for hosts with several ranks): the
  aggregator SIGKILLed inside a multi-chunk all-reduce, the job goes on on the
  standby, exact.
"""
from __future__ import annotations

import os
import shutil
from typing import List

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


def test_hierarchical_on_one_host_moves_to_the_standby(tmp_path):
    """auto with three ranks on this host: the hierarchical algorithm (shared memory,
    no network stage); the primary's death is seen on its control connection and the
    job moves to a hierarchical algorithm over the standby, every result exact."""
    with spawn_switch() as primary, spawn_switch() as standby:
        a = f"{primary.address[0]}:{primary.address[1]}"
        b = f"{standby.address[0]}:{standby.address[1]}"
        results = launch(tmp_path, 3, {"NETREDUCE_SWITCH": a, "NETREDUCE_STANDBY_SWITCH": b,
                                       "NETREDUCE_ALGORITHM": "auto"},
                         steps=12, on_mark=kill(primary), kill_delay=0.05)
    assert_exact(results, 12)
    for r in results:
        assert r["stats"]["failovers"] == 1 and b in r["stats"]["path"], r["stats"]
        assert any(k.startswith("shm_") for k in r["stats"]), r["stats"]  # hierarchical


def _own_pid_namespace(rank: int) -> List[str]:
    # a host of its own for the topology exchange (its label carries the pid namespace)
    return ["unshare", "--pid", "--fork", "--"]


def test_hierarchical_network_stage_moves_to_the_standby(tmp_path):
    """NETREDUCE_ALGORITHM=hierarchical, each rank a host of its own (its own pid
    namespace, the same loopback), so the hierarchical pipeline's network stage
    streams shards through the aggregator; SIGKILLed inside the 16 MiB all-reduce's
    data, the job goes on on the standby, hierarchical again, every result exact, and
    the ranks did hold partial results of the interrupted call."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) (a pid namespace per rank = a host each)")
    with spawn_switch() as primary, spawn_switch() as standby:
        a = f"{primary.address[0]}:{primary.address[1]}"
        b = f"{standby.address[0]}:{standby.address[1]}"
        results = launch(tmp_path, 3, {"NETREDUCE_SWITCH": a, "NETREDUCE_STANDBY_SWITCH": b,
                                       "NETREDUCE_ALGORITHM": "hierarchical"},
                         steps=12, on_mark=kill(primary, mid_transfer=True),
                         prefix=_own_pid_namespace)
    assert_exact(results, 12)
    for r in results:
        assert r["stats"]["failovers"] == 1 and b in r["stats"]["path"], r["stats"]
        assert r["stats"].get("shm_calls", 0) > 0 and "packets_received" in r["stats"], \
            r["stats"]  # hierarchical with a network stage
    assert any(r["stats"]["interrupted_partial"] for r in results), [r["history"] for r in results]
