"""The steady state without the coordinator (netreduce/worker/agreement.py): ranks as
threads through the public API, on the fakes (the fake fabric checks that every
rank issues the same data-plane messages in the same order, rounds included)."""
import threading
import time

import numpy as np
import pytest

import netreduce as nr
from netreduce.worker import context
from netreduce.errors import NegotiationError, RankFailedError


def _step(r, names, shapes=None, dtype=np.float32):
    shapes = shapes or {}
    handles = {n: nr.allreduce_async(np.full(shapes.get(n, (3,)), r + 1, dtype), op=nr.Sum,
                                     name=n) for n in names}
    return {n: nr.synchronize(h) for n, h in handles.items()}


@pytest.mark.parametrize("size", [2, 3])
def test_cached_steps_ask_the_coordinator_nothing(ranks, size):
    want = size * (size + 1) / 2

    def fn(r):
        comm = context.thread.comm
        _step(r, ["a", "b", "c"])             # negotiated: every rank learns the ids
        before = comm.neg.requests
        for _ in range(10):
            out = _step(r, ["a", "b", "c"])
            assert all((v == want).all() for v in out.values())
        return comm.neg.requests - before, comm.agreement.agreed, comm.agreement.fallbacks
    for requests, agreed, fallbacks in ranks(size).run(fn):
        assert requests == 0                  # not one coordinator request in 10 steps
        assert agreed == 30 and fallbacks == 0


def test_changed_tensor_set_falls_back_and_recaches(ranks):
    def fn(r):
        comm = context.thread.comm
        _step(r, ["a", "b"])
        _step(r, ["a", "b"])
        agreed = comm.agreement.agreed
        requests = comm.neg.requests
        # new tensor 'c'; 'b' changes shape: both go to the coordinator ...
        out = _step(r, ["a", "b", "c"], {"b": (5,)})
        assert (out["b"] == 3).all() and out["b"].shape == (5,) and (out["c"] == 3).all()
        assert comm.neg.requests > requests
        # ... which gives them (new) ids: from the next step on, agreed again
        requests = comm.neg.requests
        for _ in range(3):
            out = _step(r, ["a", "b", "c"], {"b": (5,)})
            assert all((v == 3).all() for v in out.values())
        assert comm.neg.requests == requests
        return comm.agreement.agreed - agreed
    for agreed in ranks(2).run(fn):
        assert agreed >= 1 + 9  # 'a' in the changing step, then all three for 3 steps


def test_ranks_that_disagree_get_the_mismatch_error_not_a_hang(ranks):
    def fn(r):
        _step(r, ["x"])
        _step(r, ["x"])                       # 'x' cached, agreed on
        t0 = time.monotonic()
        with pytest.raises(NegotiationError, match=r"Mismatched allreduce tensor shapes.*"
                                                   r"Tensor 'x'.*rank 0 sent \[3\].*"
                                                   r"rank 1 sent \[4\]"):
            _step(r, ["x"], {"x": (3 + r,)})  # rank 1 changed its shape, rank 0 did not
        return time.monotonic() - t0
    for waited in ranks(2, NETREDUCE_TIMEOUT=20).run(fn):
        assert waited < 15                    # resolved by the coordinator, no timeout


def test_cached_tensor_one_rank_never_submits_times_out_naming_it(ranks):
    timed_out = threading.Event()

    def fn(r):
        _step(r, ["x"])
        _step(r, ["x"])
        if r == 1:  # alive, idle, never submits 'x' again, until rank 0 has timed out
            assert timed_out.wait(30)
            return None
        try:
            with pytest.raises(NegotiationError, match=r"tensor 'x' was not submitted by rank 1 "
                                                       r"of job 'job' within NETREDUCE_TIMEOUT"):
                _step(r, ["x"])
        finally:
            timed_out.set()
        return True
    # The test waits the whole timeout: 1 s (stale_s 0.05 s, the same path to the
    # coordinator as at 3 s, whose 3 s were two thirds of this file's wall time).
    R = ranks(2, NETREDUCE_TIMEOUT=1)
    R.run(fn, shutdown=False)
    for comm in R.comms:
        comm.shutdown()


def test_cached_tensor_submitted_late_by_one_rank_still_completes(ranks):
    """A straggler beyond stale_s: the tensor leaves the agreement for the coordinator
    on every rank, completes there, and is agreed on again afterwards."""
    R = ranks(2, NETREDUCE_TIMEOUT=20)  # stale_s 0.5 s
    two_steps = [threading.Event(), None]

    def fn(r):
        comm = context.thread.comm
        _step(r, ["x"])
        _step(r, ["x"])
        if r == 0:
            two_steps[1] = comm.neg.requests
            two_steps[0].set()
        else:
            # > stale_s (0.5 s at a 20 s timeout): late until rank 0 has given up on the
            # agreement and asked the coordinator (was a fixed 2 s, which stays the bound)
            two_steps[0].wait(10.0)
            deadline = time.monotonic() + 2.0
            while R.comms[0].neg.requests <= two_steps[1] and time.monotonic() < deadline:
                time.sleep(0.01)
        out = _step(r, ["x"])
        assert (out["x"] == 3).all()
        requests = comm.neg.requests
        for _ in range(3):
            assert (_step(r, ["x"])["x"] == 3).all()
        return comm.neg.requests - requests
    for requests in R.run(fn):
        assert requests == 0


def test_agreement_off_asks_the_coordinator_every_step(ranks):
    def fn(r):
        comm = context.thread.comm
        _step(r, ["a"])
        before = comm.neg.requests
        for _ in range(3):
            _step(r, ["a"])
        return comm.agreement, comm.neg.requests - before
    for agreement, requests in ranks(2, NETREDUCE_CACHE_AGREEMENT=False).run(fn):
        assert agreement is None and requests >= 3


def test_a_rank_dying_during_rounds_fails_the_others_naming_it(ranks):
    def fn(r):
        _step(r, ["x"])
        _step(r, ["x"])
        if r == 1:
            context.thread.comm.neg.close()         # what a killed process leaves behind
            return None
        with pytest.raises(RankFailedError, match="rank 1 disconnected"):
            for _ in range(100):
                _step(r, ["x"])
        return True
    R = ranks(2, NETREDUCE_TIMEOUT=30)
    t0 = time.monotonic()
    R.run(fn, shutdown=False)
    assert time.monotonic() - t0 < 15       # the round was aborted, not timed out
    R.comms[0].shutdown()
