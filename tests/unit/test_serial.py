"""netreduce/algorithms/serial.py: a blocking algorithm's calls, submitted ones
included, run one at a time in the order made (what keeps the ranks' messages
aligned when the pipeline hands hierarchical or failover a group and the executor
goes on to its next round)."""
from __future__ import annotations

import threading

import pytest

from netreduce.algorithms.serial import Serial
from netreduce.errors import DataPlaneError, RankFailedError


def test_a_blocking_call_runs_behind_what_was_submitted_before_it():
    s = Serial("t")
    gate = threading.Event()
    order = []
    first = s.submit(lambda: (gate.wait(5), order.append("first"))[1] or "a")
    second = s.submit(lambda: order.append("second") or "b")
    caller = threading.Thread(target=lambda: order.append(s.call(lambda: "call")))
    caller.start()
    caller.join(0.05)
    assert caller.is_alive() and order == []  # queued behind the two, not run inline
    gate.set()
    caller.join(5)
    assert order == ["first", "second", "call"]
    assert first.wait() == "a" and second.wait() == "b" and first.done()


def test_an_idle_queue_runs_the_call_on_the_callers_thread():
    s = Serial("t")
    assert s.call(threading.current_thread) is threading.current_thread()
    assert s.submit(threading.current_thread).wait() is not threading.current_thread()
    assert s.call(threading.current_thread) is threading.current_thread()


def test_errors_reach_the_waiter_unchanged():
    s = Serial("t")

    def fail():
        raise RankFailedError("rank 2 died", 2)
    req = s.submit(fail)
    with pytest.raises(RankFailedError) as info:
        req.wait()
    assert info.value.rank == 2
    assert s.submit(lambda: 7).wait() == 7  # the queue goes on


def test_close_fails_what_is_queued_and_every_later_call():
    s = Serial("t")
    gate, started = threading.Event(), threading.Event()
    running = s.submit(lambda: (started.set(), gate.wait(5))[1] and "ran")
    queued = s.submit(lambda: "never")
    assert started.wait(5)
    threading.Timer(0.05, gate.set).start()
    s.close("rank 0: closed", 5.0)  # waits for the running call
    assert running.wait() == "ran"
    with pytest.raises(DataPlaneError, match="rank 0: closed"):
        queued.wait()
    with pytest.raises(DataPlaneError, match="rank 0: closed"):
        s.call(lambda: "late")
