"""netreduce/worker/failover.py's recovery, ranks as threads, with the split that real kills
reach only by chance made certain: the path dies after ranks 0 and 1 received all of
call m's results and rank 2 did not (its in-place buffer holds part of them). Rank 2
must get call m's result from a peer, ranks 0 and 1 must redo call m+1, and every
result must be exact and identical on every rank. The paths are in-process fakes;
the Failover objects, their threads and their protocol are the real ones."""
from __future__ import annotations

import threading
import types
from typing import Any, Dict, List

import numpy as np
import pytest

from netreduce.errors import DataPlaneError
from netreduce.worker.failover import Failover
from netreduce.worker.job_paths import Candidate

N = 3


class Exchange:
    """Sums the ranks' arrays: every rank posts, every rank gets the numpy sum."""

    def __init__(self, n: int) -> None:
        self.n, self.cond, self.rounds = n, threading.Condition(), {}

    def post(self, key: Any, rank: int, array: np.ndarray, op: str = "sum") -> np.ndarray:
        with self.cond:
            posted = self.rounds.setdefault(key + (op,), {})
            posted[rank] = array.copy()
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: len(posted) == self.n, timeout=20)
            parts = [posted[r] for r in range(self.n)]
            return np.minimum.reduce(parts) if op == "min" else sum(parts)


class GoodPath:
    """The standby: a correct all-reduce among the rank threads."""

    def __init__(self, ex: Exchange, rank: int) -> None:
        self.ex, self.rank, self.calls = ex, rank, 0

    def allreduce(self, src, dst=None, op="sum", dtype=None):
        dst = src if dst is None else dst
        dst[...] = self.ex.post(("good", self.calls, src.dtype.str, src.size), self.rank, src, op)
        self.calls += 1
        return dst

    def abort(self, reason): pass
    def close(self): pass
    def stats(self): return {"packets_received": 0}


class DyingPath:
    """Correct up to call ``m``; in call m every rank contributes but only the
    ``finishers`` get the whole result (the laggard gets half of it in place, then
    waits); every later call hangs. All waits end with the abort."""

    def __init__(self, ex: Exchange, rank: int, m: int, finishers: List[int]) -> None:
        self.ex, self.rank, self.m, self.finishers = ex, rank, m, finishers
        self.calls, self.received = 0, 0
        self.aborted = threading.Event()
        self.reached: Dict[int, threading.Event] = {}

    def allreduce(self, src, dst=None, op="sum", dtype=None):
        dst = src if dst is None else dst
        c, self.calls = self.calls, self.calls + 1
        if c < self.m:
            dst[...] = self.ex.post(("dying", c), self.rank, src, op)
            self.received += 1
            return dst
        if c == self.m:
            total = self.ex.post(("dying", c), self.rank, src, op)
            if self.rank in self.finishers:
                dst[...] = total
                self.received += 1
                return dst
            half = dst.size // 2
            dst.reshape(-1)[:half] = total.reshape(-1)[:half]  # partial, in place
            self.received += 1
        self.reached.setdefault(c, threading.Event()).set()
        self.aborted.wait(20)
        raise DataPlaneError(f"aggregator 127.0.0.1:1: aborted in call {c}")

    def abort(self, reason): self.aborted.set()
    def close(self): pass
    def stats(self): return {"packets_received": self.received}


class Rendezvous:
    """rendezvous.Rendezvous's contract in process."""

    def __init__(self, n: int) -> None:
        self.n, self.cond, self.rounds, self.req = n, threading.Condition(), {}, None

    def gather(self, key, value, wait=None, rank=None):
        with self.cond:
            posted = self.rounds.setdefault(key, {})
            posted[rank] = value
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: len(posted) == self.n, timeout=20)
            return [posted[r] for r in range(self.n)]

    def request(self, gen, reason):
        with self.cond:
            if self.req is None or self.req["gen"] < gen:
                self.req = {"gen": gen, "reason": reason}
                self.cond.notify_all()

    def watch(self, gen):
        with self.cond:
            self.cond.wait_for(lambda: self.req is not None and self.req["gen"] >= gen, timeout=0.2)
            return dict(self.req) if self.req is not None and self.req["gen"] >= gen else {}


def rank_rv(shared: Rendezvous, rank: int):
    return types.SimpleNamespace(gather=lambda k, v, wait=None: shared.gather(k, v, wait, rank),
                                 request=shared.request, watch=shared.watch, close=lambda: None)


@pytest.mark.parametrize("mode", ["in_place", "out", "submitted"])
def test_a_rank_that_missed_the_last_results_gets_them_from_a_peer(mode):
    """``submitted``: the calls go as the step pipeline hands them over
    (allreduce_async, netreduce/worker/pipeline.py), several queued at once, every
    third a blocking call made behind them (a round): they still run one at a time
    in the order made, so the split and its recovery are the same."""
    m, calls = 4, 7
    ex, rv = Exchange(N), Rendezvous(N)
    cands = [Candidate("host", [("127.0.0.1", 1)] * N), Candidate("host", [("127.0.0.1", 2)] * N)]
    dying = [DyingPath(ex, r, m, finishers=[0, 1]) for r in range(N)]
    algos = []
    for r in range(N):
        opener = types.SimpleNamespace(first=lambda cs, order, key, reach_for=0.0, r=r:
                                       (1, GoodPath(ex, r), []))
        algos.append(Failover(cands, 0, dying[r], opener, rank_rv(rv, r),
                              types.SimpleNamespace(rank=r, size=N, job="j"), timeout=20.0))

    def data(r: int, c: int) -> np.ndarray:
        rng = np.random.default_rng([c, r])
        return rng.integers(-1000, 1000, 10_001).astype(np.int64)

    results: Dict[int, List[np.ndarray]] = {r: [] for r in range(N)}
    errors: List[BaseException] = []

    def run(r: int) -> None:
        try:
            if mode == "submitted":
                reqs: List[Any] = []
                for c in range(calls):
                    x = data(r, c)
                    if c % 3 == 2:
                        reqs.append(algos[r].allreduce(x).copy())
                    else:
                        reqs.append(algos[r].allreduce_async(x))
                results[r].extend(q if isinstance(q, np.ndarray) else q.wait().copy()
                                  for q in reqs)
                return
            for c in range(calls):
                x = data(r, c)
                if mode == "in_place":
                    results[r].append(algos[r].allreduce(x).copy())
                else:
                    out = np.empty_like(x)
                    algos[r].allreduce(x, out)
                    assert np.array_equal(x, data(r, c)), "input changed"
                    results[r].append(out)
        except BaseException as exc:  # reported below
            errors.append(exc)

    _split_at(m, run, dying, rv, errors)
    for c in range(calls):
        want = sum(data(r, c) for r in range(N))
        for r in range(N):
            assert np.array_equal(results[r][c], want), (r, c)
    hist = [a.history for a in algos]
    assert all(len(h) == 1 and h[0]["completed"] == [m + 1, m + 1, m] for h in hist), hist
    assert hist[2][0]["from_peer"] == 1 and hist[0][0]["from_peer"] == 0, hist
    assert hist[0][0]["redone"] == 1 and hist[2][0]["redone"] == 0, hist
    assert hist[0][0]["partial_ranks"] == 1  # the laggard held half of call m in place
    assert all(a.stats()["generation"] == 1 for a in algos)
    closers = [threading.Thread(target=a.close) for a in algos]
    for t in closers:
        t.start()
    for t in closers:
        t.join(30)


def test_a_round_cut_short_decides_the_same_next_call_on_every_rank():
    """The agreement's messages under failover (agreement.py, speculation.py):
    call m is a round, a MIN all-reduce whose result decides the next call (here its
    size, as a round decides which group runs next). Ranks 0 and 1 got the round's
    result and went on into the call it decided; rank 2 did not (half of it in
    place). After the failover rank 2 holds the same MIN result (sent by a peer as a
    sum of words: a MIN with the others' zeros would be wrong), so it issues the same
    next call, and every result is exact."""
    m, calls = 4, 8
    ex, rv = Exchange(N), Rendezvous(N)
    cands = [Candidate("host", [("127.0.0.1", 1)] * N), Candidate("host", [("127.0.0.1", 2)] * N)]
    dying = [DyingPath(ex, r, m, finishers=[0, 1]) for r in range(N)]
    algos = [Failover(cands, 0, dying[r], types.SimpleNamespace(
                 first=lambda cs, order, key, reach_for=0.0, r=r: (1, GoodPath(ex, r), [])),
                 rank_rv(rv, r), types.SimpleNamespace(rank=r, size=N, job="j"), timeout=20.0)
             for r in range(N)]

    def vote(r: int, c: int) -> np.ndarray:  # positive, so MIN with zeros would show
        return np.random.default_rng([c, r, 7]).integers(1, 1000, 67).astype(np.int32)

    seen: Dict[int, List[np.ndarray]] = {r: [] for r in range(N)}
    errors: List[BaseException] = []

    def run(r: int) -> None:
        try:
            size = 5
            for c in range(calls):
                if c % 2 == 0:  # a round, in place in its vector
                    v = vote(r, c)
                    algos[r].allreduce(v, op="min")
                    seen[r].append(v.copy())
                    size = int(v[0]) % 97 + 1  # decides the next call
                else:
                    x = np.full(size, r + c, np.int64)
                    seen[r].append(algos[r].allreduce(x).copy())
        except BaseException as exc:  # reported below
            errors.append(exc)

    _split_at(m, run, dying, rv, errors)
    for c in range(calls):
        if c % 2 == 0:
            want = np.minimum.reduce([vote(r, c) for r in range(N)])
        else:
            size = int(seen[0][c - 1][0]) % 97 + 1
            want = sum(np.full(size, r + c, np.int64) for r in range(N))
        for r in range(N):
            assert np.array_equal(seen[r][c], want), (r, c)
    hist = [a.history for a in algos]
    assert hist[2][0]["from_peer"] == 1 and hist[0][0]["redone"] == 1, hist
    assert hist[2][0]["interrupted_bytes"] == 67 * 4, hist  # cut short in the round
    closers = [threading.Thread(target=a.close) for a in algos]
    for t in closers:
        t.start()
    for t in closers:
        t.join(30)


def _split_at(m, run, dying, rv, errors) -> None:
    """Run ``run(r)`` on N threads; the aggregator "dies" once the finishers (ranks 0
    and 1) are inside call m+1 and the laggard (rank 2) waits in call m: some rank
    notices and asks for the failover. Returns when every thread ended, error-free."""
    threads = [threading.Thread(target=run, args=(r,)) for r in range(N)]
    for t in threads:
        t.start()
    for r, c in ((0, m + 1), (1, m + 1), (2, m)):
        assert dying[r].reached.setdefault(c, threading.Event()).wait(20)
    rv.request(0, "aggregator 127.0.0.1:1 closed its control connection")
    for t in threads:
        t.join(30)
    assert not errors, errors
