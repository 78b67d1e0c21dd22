"""Loss, reordering and duplication on loopback (issue 14): 3 ranks run 1,000
all-reduces of random sizes, dtypes and ops (the stream of benchmarks/loss.py) at
1 % and 5 % loss by the engine's drop knob, and through a user-space relay that
duplicates, reorders and delays packets both ways. Every rank checks every result
bit for bit against the numpy reference; the ranks' digests of all results must
agree; nothing may hang (run_ranks' timeout). Timings are benchmarks/loss.py's."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid

import numpy as np
import pytest

from benchmarks import loss
from netreduce.worker import dataplane
from netreduce.protocol.client import ControlClient
from netreduce.errors import DataPlaneError
from netreduce.switch import spawn
from tests.parallel.ranks import run_ranks
from tests.procs import last_json
from tests.raw_register import register

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 1000


def _run(address, drop_rate, max_elems, seed, timeout=30.0):
    job = "loss-" + uuid.uuid4().hex[:6]
    results = run_ranks(loss.worker, 3, address, job, N, seed, max_elems, drop_rate, timeout,
                        timeout=240)
    for r in results:
        assert r["n_wrong"] == 0, r["wrong"]
    assert len({r["digest"] for r in results}) == 1, [r["digest"] for r in results]
    return {k: sum(r["stats"][k] for r in results) for k in results[0]["stats"]}


# A 4 KiB payload (RoCE-sized, ICRC on) makes many of the all-reduces several chunks
# long, so holes in the middle of a window (repaired when overtaken) occur as well
# as lost last chunks (repaired by the timeout).
@pytest.mark.parametrize("drop_rate", [0.01, 0.05])
def test_exact_under_engine_drop_knob(drop_rate):
    with spawn(payload_bytes=4096) as sw:
        stats = _run(sw.address, drop_rate, 6000, seed=int(drop_rate * 1000))
    assert stats["dropped_by_knob"] > 0, stats
    assert stats["retransmits"] >= stats["dropped_by_knob"] // 2, stats
    # Every early resend is counted under the rule that sent it.
    assert stats["overtaken_resends"] + stats["gap_resends"] + stats["tail_probes"] == \
        stats["fast_retransmits"], stats
    if drop_rate >= 0.05:
        assert stats["overtaken_resends"] > 0, stats


def test_lossless_runs_resend_little():
    # Without loss every resend is needless. The timeout follows the round trip, so a
    # loaded host may cost a few, and a descheduled peer makes the others' tail probes
    # fire (the aggregator shows those needless: the slot still waited for that peer).
    # What is left must stay a small fraction (no resend storms, no early timers).
    with spawn(payload_bytes=4096) as sw:
        stats = _run(sw.address, 0.0, 6000, seed=7)
    assert stats["dropped_by_knob"] == 0
    assert stats["retransmits"] - stats["needless_by_repeat"] <= 0.1 * stats["packets_sent"], \
        stats


def test_a_stalled_rank_costs_one_probe_per_doubling():
    # Rank 1 sends its first step and then nothing: rank 0's whole window (8 MB is
    # ~120 chunks, 32 slots outstanding) waits. Nothing completes, so only the oldest
    # chunk is resent, once per doubled timeout (from the estimate the first step
    # gave: ~8 in 1.5 s) -- not every slot at every expiry (32 per doubling), and none
    # of them counted as loss evidence.
    job = "stall-" + uuid.uuid4().hex[:6]
    with spawn() as sw:
        with dataplane.connect(sw.address, job, 1, 2, timeout=1.5) as other, \
                dataplane.connect(sw.address, job, 0, 2, timeout=1.5) as conn:
            first = [c.allreduce_async(np.ones(4, np.float32)) for c in (conn, other)]
            for q in first:
                q.wait()
            before = conn.stats()
            with pytest.raises(DataPlaneError, match="no result from the aggregator") as info:
                conn.allreduce(np.ones(2_000_000, np.float32))
            after = conn.stats()
    stats = {k: after[k] - before[k] for k in ("retransmits", "fast_retransmits",
                                               "timeout_probes", "held_probes")}
    # The error counts the operation's resends, not those of the slot it names.
    assert f"({stats['retransmits']} retransmissions)" in str(info.value)
    assert stats["fast_retransmits"] == 0 and stats["held_probes"] == 0, stats
    assert stats["retransmits"] == stats["timeout_probes"], stats
    assert 3 <= stats["retransmits"] <= 16, stats


def test_a_rank_that_never_comes_costs_one_held_probe_per_doubling():
    # The same stall in the job's first step: rank 0 has no round-trip estimate, asks,
    # and the aggregator holds its whole window (rank 1 registered, never sends). The
    # window waits quietly: one held probe per lane per interval (1 s, then 2 s...),
    # not the timer's ~8, and not one per held chunk.
    job = "never-" + uuid.uuid4().hex[:6]
    with spawn() as sw, ControlClient(sw.address) as ghost:
        register(ghost, job, 1, 2)
        with dataplane.connect(sw.address, job, 0, 2, timeout=1.5) as conn:
            with pytest.raises(DataPlaneError, match="no result from the aggregator"):
                conn.allreduce(np.ones(2_000_000, np.float32))
            stats = conn.stats()
    assert stats["held_notices"] >= 32, stats  # the whole first window, at once
    assert stats["held_probes"] == 1, stats
    assert stats["retransmits"] <= 3, stats  # + a timeout probe or two before the notices came


@contextlib.contextmanager
def _relay(port: int):
    """The relay in front of an aggregator on 127.0.0.1:port, listening on 127.0.0.2
    (same port number: the grant's data port then fits both); yields (address,
    counters), the counters filled in when the relay has stopped."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.relay", "--listen", "127.0.0.2",
                             "--upstream", f"127.0.0.1:{port}", "--dup", "0.05", "--reorder", "0.1",
                             "--delay-ms", "0.3", "--reorder-ms", "2", "--seed", "3"],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    counters: dict = {}
    try:
        assert proc.stdout.readline().strip() == "relay ready"
        yield ("127.0.0.2", port), counters
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=10)
            counters.update(last_json(out) or {})
        except (subprocess.TimeoutExpired, ValueError):
            proc.kill()
            proc.wait()


def test_exact_through_a_relay_that_duplicates_reorders_and_delays():
    # Up to 40,000 elements: several 64 KiB chunks, so reordered results overtake
    # one another; 1 % engine loss on top.
    # unicast: every result comes back through the relay (a job's group would not)
    with spawn(fanout="unicast") as sw, _relay(sw.address[1]) as (address, counters):
        stats = _run(address, 0.01, 40000, seed=11)
    assert stats["retransmits"] > 0, stats
    # The data went through the relay both ways, and the relay really mangled it.
    assert counters["to_aggregator"] > 3 * N and counters["to_workers"] > 3 * N, counters
    assert counters["duplicated"] > 0 and counters["reordered"] > 0, counters
