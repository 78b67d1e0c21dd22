"""Failover with several hosts x several ranks (issue 14): two hosts of the emulated
testbed (network namespaces, shaped 1 Gbit/s links) with two ranks each run the
hierarchical algorithm (shared memory inside a host, one shard sub-job per local
rank through the aggregator); the primary aggregator is SIGKILLed inside a 16 MiB
all-reduce's data, the job goes on on a standby daemon in the aggregator's
namespace, hierarchical again, every result bit-identical to numpy on every rank.
Needs root and the built native module; skipped with the reason otherwise."""
from __future__ import annotations

from typing import List

import pytest

from netreduce.process import free_tcp_port
from netreduce.testbed import Testbed, why_unusable
from tests.parallel.test_failover import assert_exact, kill, launch
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(REASON is not None, reason=REASON or "")]
PER_HOST = 2


def _run(tmp_path) -> List[dict]:
    """One job of 12 steps with the primary SIGKILLed inside the 16 MiB all-reduce;
    every rank's report."""
    with Testbed(hosts=2, rate="1gbit", name=scratch_testbed_name("f"),
                 subnet=scratch_subnet(), replace=True) as tb:
        primary, standby = tb.spawn_switch(port=4791), tb.spawn_switch(port=4792)
        try:
            a = f"{primary.address[0]}:{primary.address[1]}"
            b = f"{standby.address[0]}:{standby.address[1]}"

            def on_host(rank: int):  # ranks host by host, as a launcher places them
                return tb.exec_argv(rank // PER_HOST, [
                    "env", f"NETREDUCE_LOCAL_RANK={rank % PER_HOST}",
                    f"NETREDUCE_LOCAL_SIZE={PER_HOST}"])
            results = launch(tmp_path, 2 * PER_HOST, {
                "NETREDUCE_SWITCH": a, "NETREDUCE_STANDBY_SWITCH": b,
                "NETREDUCE_ALGORITHM": "hierarchical", "NETREDUCE_TIMEOUT": "30",
                # rank 0's rendezvous on its host's address: 127.0.0.1 is per namespace
                "NETREDUCE_RENDEZVOUS": f"{tb.hosts[0].address}:{free_tcp_port()}"},
                steps=12, on_mark=kill(primary, mid_transfer=True), timeout=300,
                prefix=on_host)
        finally:
            primary.stop()
            standby.stop()
    assert_exact(results, 12)
    for r in results:
        assert r["stats"]["failovers"] == 1 and b in r["stats"]["path"], r["stats"]
        assert r["stats"].get("shm_calls", 0) > 0 and "packets_received" in r["stats"], \
            r["stats"]  # hierarchical, with its network stage through the aggregator
    return results


def test_two_hosts_of_two_ranks_move_to_the_standby(tmp_path):
    pytest.importorskip("netreduce._native")
    # The hierarchical network stage is a series of short calls with shared-memory
    # work between them, so a kill made from outside lands inside a call's data (a
    # rank holding partial results, the case this test is for) in most runs, but on
    # a loaded host it can fall between two calls (2 of 6 runs at load 23): a run
    # like that is exact too but proves less, so the job is run again, up to 3 times.
    seen = []
    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        results = _run(tmp_path / str(attempt))
        seen.append([r["history"] for r in results])
        if any(r["stats"]["interrupted_partial"] for r in results):
            return
    pytest.fail(f"no rank held partial results at the kill in 3 runs: {seen}")
