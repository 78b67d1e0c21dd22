"""netreduce's own threads ahead of the user's compute (netreduce/worker/priority.py)."""
import ctypes
import os
import threading

import numpy as np
import pytest

import netreduce as nr
from netreduce.worker import context, priority

linux_root = pytest.mark.skipif(not os.path.isdir("/proc/self/task") or os.geteuid() != 0,
                                reason="a nice below 0 needs Linux and CAP_SYS_NICE")


def _nice(tid):
    return os.getpriority(os.PRIO_PROCESS, tid)


def _in_thread(fn):
    out = {}

    def run():
        out["tid"] = threading.get_native_id()
        out["result"] = fn()
        out["nice"] = _nice(out["tid"])
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out


@linux_root
def test_boost_sets_the_calling_thread_only():
    base = _nice(threading.get_native_id())
    out = _in_thread(lambda: priority.boost(-4))
    assert out["result"] is True and out["nice"] == -4
    assert _nice(threading.get_native_id()) == base


def test_zero_leaves_the_thread_as_it_is():
    base = _nice(threading.get_native_id())
    out = _in_thread(lambda: priority.boost(0))
    assert out["result"] is False and out["nice"] == base


@linux_root
def test_boost_named_finds_a_native_thread_by_its_name():
    libc = ctypes.CDLL(None, use_errno=True)
    named, go = threading.Event(), threading.Event()
    tid = {}

    def engine_like():
        tid["v"] = threading.get_native_id()
        libc.prctl(15, b"nr-test-engine", 0, 0, 0)  # PR_SET_NAME, as pthread_setname_np
        named.set()
        go.wait(10)
    t = threading.Thread(target=engine_like)
    t.start()
    try:
        assert named.wait(10)
        assert priority.boost_named(-3, "nr-test-engine") == 1
        assert _nice(tid["v"]) == -3
        assert priority.boost_named(-3, "no-such-thread") == 0
    finally:
        go.set()
        t.join()


@linux_root
@pytest.mark.parametrize("nice", [-6, 0])
def test_the_executor_runs_at_the_knobs_nice(ranks, nice):
    base = _nice(threading.get_native_id())

    def fn(r):
        out = nr.allreduce(np.full(10, r, np.float32), op=nr.Sum, name="t")
        return float(out[0]), _nice(context.comm()._exec_thread.native_id)
    for total, executor in ranks(2, NETREDUCE_THREAD_NICE=nice).run(fn):
        assert total == 1.0
        assert executor == (nice if nice else base)
