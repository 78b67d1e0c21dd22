"""Handle.add_done_callback: how an adapter whose framework completes work by
callback (TensorFlow's asynchronous kernels) learns that an operation finished,
without a thread waiting for it."""
import threading

import numpy as np

import netreduce as nr
from netreduce.worker.handle import Handle
from netreduce.errors import NegotiationError


def test_callback_runs_once_with_the_result_on_the_finishing_thread(ranks):
    def fn(r):
        done = threading.Event()
        seen = []
        h = nr.allreduce_async(np.full(5, r + 1, np.float32), op=nr.Sum, name="cb")
        h.add_done_callback(lambda handle: (seen.append((threading.current_thread().name,
                                                          handle.wait().copy())), done.set()))
        assert done.wait(10)  # nobody called wait() before the callback ran
        return seen
    for seen in ranks(2).run(fn):
        (thread, result), = seen
        assert thread.startswith("netreduce") and (result == 3).all()


def test_callback_added_after_completion_runs_at_once_and_errors_reach_it(ranks):
    def fn(r):
        h = nr.allreduce_async(np.ones(2 + r, np.float32), name="mismatch")
        got = []
        h.add_done_callback(got.append)
        try:
            h.wait()
        except NegotiationError:
            pass
        late = []
        h.add_done_callback(late.append)  # already finished: runs here, now
        return got, late
    for got, late in ranks(2).run(fn):
        assert len(got) == 1 and len(late) == 1


def test_a_failing_callback_does_not_stop_the_others():
    h = Handle([np.zeros(1)], grouped=False)
    calls = []
    h.add_done_callback(lambda _: 1 / 0)
    h.add_done_callback(calls.append)
    h._finish_one()
    assert calls == [h] and h.done()
