"""A round read when the data plane starts it (netreduce/worker/agreement.py, ``live``):
a submission made while the round is issued but not yet started -- queued behind an
agreed group's data on the wire -- is agreed by that round, not the next one.

The fake data plane here reads a round's vector only once the test lets it start, as
the engine reads a message's source when it takes the message off its queue."""
import threading

import numpy as np

import netreduce as nr
from netreduce.worker import context
from netreduce.worker.agreement import HEADER, READY
from netreduce.worker.wake_queue import WAKE
from tests.unit.fakes import FakeConn, FakeFabric


class GatedFabric(FakeFabric):
    """Holds each rank's first round that carries a READY mark until ``release``."""

    def __init__(self, size: int, timeout: float) -> None:
        super().__init__(timeout=timeout)
        self.entered = [threading.Event() for _ in range(size)]
        self.release = threading.Event()
        self.gated = set()
        self.calls_at_gate = {}

    def connect(self, address, job, rank, size, **_):
        return GatedConn(self, job, rank, size)


class GatedConn(FakeConn):
    def allreduce(self, src, dst=None, op="sum", dtype=None, scale=1.0):
        f = self.fabric
        if op == "min" and self.rank not in f.gated and (src[HEADER:] == READY).any():
            f.gated.add(self.rank)
            with f.cond:
                f.calls_at_gate[self.rank] = len(f.calls)
            f.entered[self.rank].set()
            assert f.release.wait(10.0), "the test never released the round"
        return super().allreduce(src, dst, op, dtype, scale)


def b_while_a_is_in_the_round(ranks, then=None):
    """Two ranks; "a" and "b" negotiated first (ids known), then "a" submitted and the
    executor held inside the round that carries it while "b" is submitted and
    ``then(agreement, ha, hb)`` runs. Returns the fabric and, per rank, a's and b's
    sums, the executor's queue as it stood before the release, and the agreement."""
    R = ranks(2)
    fabric = R.fabric = GatedFabric(2, R.fabric.timeout)
    both_submitted = threading.Barrier(2, timeout=10.0)

    def fn(r):
        a, b = np.full(3, r + 1, np.float32), np.full(5, 10 * (r + 1), np.float32)
        nr.synchronize(nr.allreduce_async(a.copy(), op=nr.Sum, name="a"))  # negotiated:
        nr.synchronize(nr.allreduce_async(b.copy(), op=nr.Sum, name="b"))  # ids known
        agreement = context.thread.comm.agreement
        ha = nr.allreduce_async(a.copy(), op=nr.Sum, name="a")
        assert fabric.entered[r].wait(10.0)      # the round with "a" issued, not returned
        hb = nr.allreduce_async(b.copy(), op=nr.Sum, name="b")
        if then is not None:
            then(agreement, ha, hb)
        queued = list(agreement.q.queue)
        both_submitted.wait()
        if r == 0:
            fabric.release.set()
        return nr.synchronize(ha), nr.synchronize(hb), queued, agreement

    return fabric, R.run(fn)


def test_a_submission_made_while_the_round_waits_to_start_is_agreed_by_it(ranks):
    fabric, results = b_while_a_is_in_the_round(ranks)
    for out_a, out_b, _, _ in results:
        assert (out_a == 3).all() and (out_b == 30).all()
    # After the gated round, each rank's next data message is "a" and "b" fused (8
    # elements): the round agreed both; a round read at issue would agree "a" alone.
    for r in range(2):
        after = [c for c in fabric.calls[fabric.calls_at_gate[r]:]
                 if c[1] == r and c[3] == "sum"]
        assert after and after[0][2] == 8, after
    assert [getattr(ag, "live_marks", 0) for _, _, _, ag in results] == [1, 1]


def test_a_submission_made_while_a_round_is_live_does_not_wake_the_executor(ranks):
    """The executor is inside the round (issued, not returned): it reads the pending
    submissions when it returns, so a submission made meanwhile puts no wake-up on
    its queue (a thread hand-off per gradient hook on main), and is still agreed."""
    _, results = b_while_a_is_in_the_round(ranks)
    for out_a, out_b, queued, _ in results:
        assert (out_a == 3).all() and (out_b == 30).all()
        assert WAKE not in queued, queued
