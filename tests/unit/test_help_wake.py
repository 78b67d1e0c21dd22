"""A user's wait puts a wake-up on the executor's queue only when the executor
would not see the submission without one (netreduce/worker/agreement.py, ``owed``):
in the wait after backward, a wake per gradient still in flight was a thread
hand-off each."""
import threading

import numpy as np

import netreduce as nr
from netreduce.worker import context
from netreduce.worker.agreement import WAKE
from tests.unit.test_live_round import GatedFabric


def test_a_wait_on_a_submission_the_executor_will_read_puts_no_wake(ranks):
    """The executor is inside a round carrying "a"; "b" is submitted meanwhile (no
    wake: the executor reads pending when the round returns). Waiting on either
    (Handle.wait's help) puts no wake-up either, and both are still reduced."""
    R = ranks(2)
    fabric = R.fabric = GatedFabric(2, R.fabric.timeout)
    both_waited = threading.Barrier(2, timeout=10.0)

    def fn(r):
        a, b = np.full(3, r + 1, np.float32), np.full(5, 10 * (r + 1), np.float32)
        nr.synchronize(nr.allreduce_async(a.copy(), op=nr.Sum, name="a"))  # negotiated:
        nr.synchronize(nr.allreduce_async(b.copy(), op=nr.Sum, name="b"))  # ids known
        agreement = context.thread.comm.agreement
        ha = nr.allreduce_async(a.copy(), op=nr.Sum, name="a")
        assert fabric.entered[r].wait(10.0)      # the executor is inside the round
        hb = nr.allreduce_async(b.copy(), op=nr.Sum, name="b")
        agreement.help(ha)                       # what ha.wait() runs first
        agreement.help(hb)
        queued = list(agreement.q.queue)
        both_waited.wait()
        if r == 0:
            fabric.release.set()
        return nr.synchronize(ha), nr.synchronize(hb), queued

    for out_a, out_b, queued in R.run(fn):
        assert (out_a == 3).all() and (out_b == 30).all()
        assert WAKE not in queued, queued

