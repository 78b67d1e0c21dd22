"""Tail repair (native/engine/repair.h, issue 14): a message's last chunk, which no
later result can overtake, is resent after a tail probe of about 2 srtt instead of
the full timeout, and once loss has been seen a small one goes out twice. 3 ranks,
one-chunk all-reduces at 5 % engine loss: every result exact on every rank, the
copies reached the aggregator and were counted as duplicates there, never added."""
from __future__ import annotations

import uuid

import numpy as np

from benchmarks import loss
from netreduce.worker import dataplane
from netreduce.switch import spawn
from tests.parallel.ranks import run_ranks


def _stream(address, n, max_elems, drop_rate, seed):
    job = "tail-" + uuid.uuid4().hex[:6]
    results = run_ranks(loss.worker, 3, address, job, n, seed, max_elems, drop_rate, 30.0,
                        timeout=240)
    for r in results:
        assert r["n_wrong"] == 0, r["wrong"]
    assert len({r["digest"] for r in results}) == 1, [r["digest"] for r in results]
    stats = {k: sum(r["stats"][k] for r in results) for k in results[0]["stats"]}
    return stats, results[0]["aggregator"]


def test_lost_tails_are_probed_and_small_tails_copied_once_loss_is_seen():
    with spawn() as sw:
        stats, agg = _stream(sw.address, 400, 64, 0.05, seed=21)
    # Every all-reduce is one chunk: each is its lane's tail. Before the engine has
    # seen loss, a lost one is repaired by its tail probe (resent early, not by the
    # timeout); afterwards every one goes out twice.
    assert stats["tail_probes"] > 0, stats
    assert stats["tail_probes"] <= stats["fast_retransmits"] <= stats["retransmits"], stats
    assert stats["tail_copies"] > 0, stats
    assert stats["tail_copies"] <= 3 * 400, stats  # at most one per rank and message
    # A copy the knob did not drop (95 %) reaches the aggregator as a duplicate: counted
    # there and never added (the results above are exact).
    assert agg["duplicates"] >= 0.8 * stats["tail_copies"], (agg, stats)
    # A repaired chunk's wait is counted (first send to result).
    assert stats["repaired_chunks"] > 0 and stats["repair_wait_us"] > 0, stats


def _large(rank, size, address, job, n):
    # Every all-reduce 20,000 float32: two 64 KiB-payload chunks, the tail 14,536 B.
    with dataplane.connect(address, job, rank, size, timeout=30.0, drop_rate=0.05,
                           seed=rank + 1) as conn:
        for i in range(n):
            a = np.full(20_000, rank + i, np.float32)
            conn.allreduce(a)
            assert (a == sum(r + i for r in range(size))).all(), i
        return conn.stats()


def test_tails_above_the_copy_limit_are_not_copied():
    # Loss is seen (well past the 200-packet estimate gate), but every tail is larger
    # than the copy limit (9,000 B): repaired by resends only, never sent twice.
    with spawn() as sw:
        results = run_ranks(_large, 3, sw.address, "tail-" + uuid.uuid4().hex[:6], 300,
                            timeout=240)
    stats = {k: sum(r[k] for r in results) for k in results[0]}
    assert stats["packets_sent"] >= 3 * 600 and stats["dropped_by_knob"] > 0, stats
    assert stats["retransmits"] > 0, stats
    assert stats["tail_copies"] == 0, stats


def _one_lossy(rank, size, address, job, n):
    # Rank 0 loses 5 % of its packets, ranks 1 and 2 none; one-chunk all-reduces.
    with dataplane.connect(address, job, rank, size, timeout=30.0,
                           drop_rate=0.05 if rank == 0 else 0.0, seed=rank + 7) as conn:
        for i in range(n):
            a = np.full(64, rank + i, np.float32)
            conn.allreduce(a)
            assert (a == sum(r + i for r in range(size))).all(), i
        return conn.stats()


def test_copies_follow_a_ranks_own_loss_not_its_peers():
    # Every loss of rank 0 stalls the slot for all three ranks, so ranks 1 and 2 probe
    # too. Their resends reach a slot that already holds their contribution: the
    # aggregator marks their results (repeat seen), those chunks count as not lost,
    # and only rank 0 -- whose tails a copy protects -- switches copies on.
    with spawn() as sw:
        results = run_ranks(_one_lossy, 3, sw.address, "tail-" + uuid.uuid4().hex[:6], 400,
                            timeout=240)
    lossy, peers = results[0], results[1:]
    assert lossy["dropped_by_knob"] > 0 and lossy["tail_copies"] > 0, lossy
    for s in peers:
        assert s["dropped_by_knob"] == 0 and s["tail_copies"] == 0, s
    assert sum(s["needless_by_repeat"] for s in peers) > 0, peers
    for s in peers:  # never more proven than repaired (one proof per chunk)
        assert s["spurious_retransmits"] <= s["repaired_chunks"], s
