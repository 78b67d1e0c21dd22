"""Steady steps in one data-plane message (netreduce/worker/speculation.py): ranks as threads
through the public API, on the fakes. The fake fabric fails any message whose size,
op or dtype differs between ranks, so every test also checks that all ranks issued
the same speculative messages and rounds in the same order."""
import time

import numpy as np
import pytest

import netreduce as nr
from netreduce.worker import context


def _data(r, step, name, shape=(5,), dtype=np.float32):
    """Integers (exact sums in any order) that differ per rank, step and name."""
    seed = r * 1000 + step * 10 + sum(map(ord, name))
    return np.random.default_rng(seed).integers(-50, 50, shape).astype(dtype)


def _want(size, step, name, shape=(5,), dtype=np.float32):
    return sum(_data(r, step, name, shape, dtype) for r in range(size))


def _step(r, step, names, shapes=None, dtype=np.float32, sleep=None):
    shapes = shapes or {}
    handles = {}
    for n in names:
        if sleep:
            sleep(n)
        handles[n] = nr.allreduce_async(_data(r, step, n, shapes.get(n, (5,)), dtype),
                                        op=nr.Sum, name=n)
    return {n: nr.synchronize(h) for n, h in handles.items()}


def _check(out, size, step, shapes=None, dtype=np.float32):
    shapes = shapes or {}
    for n, v in out.items():
        want = _want(size, step, n, shapes.get(n, (5,)), dtype)
        assert v.dtype == want.dtype and np.array_equal(v, want), (n, step, v, want)


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int8])
def test_steady_steps_are_speculative_and_exact(ranks, size, dtype):
    def fn(r):
        comm = context.thread.comm
        for step in range(16):
            _check(_step(r, step, ["g"], dtype=dtype), size, step, dtype=dtype)
        spec = comm.agreement.spec
        return spec.hits, comm.agreement.rounds, comm.neg.requests
    for hits, rounds, requests in ranks(size).run(fn):
        assert hits >= 4                      # steps 3.. one message each (load may miss)
        assert requests <= 2                  # the first step's negotiation only


def test_grouped_and_scaled_steps_match_the_plain_path(ranks):
    """Average, pre/post-scale and a fused group of two: the speculative copy-out does
    what the group's own message did; results bit-identical on every rank."""
    def fn(r):
        outs = []
        for step in range(10):
            arrays = [np.random.default_rng(r * 77 + step).standard_normal(s).astype(np.float32)
                      for s in ((7,), (3, 4))]
            outs.append(nr.grouped_allreduce(arrays, op=nr.Average, name="pair",
                                             prescale_factor=0.5, postscale_factor=3.0))
        return outs, context.thread.comm.agreement.spec.hits
    results = ranks(3).run(fn)
    for step in range(10):
        arrays = [[np.random.default_rng(r * 77 + step).standard_normal(s).astype(np.float32)
                   for s in ((7,), (3, 4))] for r in range(3)]
        for k in range(2):
            want = sum(a[k] * np.float32(0.5) for a in arrays) * np.float32(3.0 / 3)
            np.testing.assert_allclose(results[0][0][step][k], want, rtol=1e-6)
            for r in (1, 2):                  # the same bits everywhere
                assert results[r][0][step][k].tobytes() == results[0][0][step][k].tobytes()
    assert all(hits >= 3 for _, hits in results)


def test_a_rank_submitting_another_set_in_another_order_late_stays_exact(ranks):
    def fn(r):
        comm = context.thread.comm
        for step in range(6):
            _check(_step(r, step, ["a"]), 2, step)
        assert comm.agreement.spec.armed or comm.agreement.spec.hits > 0
        # rank 1 submits 'b' (new: the coordinator) first, and both late
        names = ["a", "b"] if r == 0 else ["b", "a"]
        delay = (lambda n: time.sleep(0.02)) if r == 1 else None
        _check(_step(r, 6, names, sleep=delay), 2, 6)
        hits = comm.agreement.spec.hits
        for step in range(7, 15):             # back to {a}: speculative again
            _check(_step(r, step, ["a"]), 2, step)
        return comm.agreement.spec.hits - hits
    for hits in ranks(2).run(fn):
        assert hits >= 1


def test_alternating_sets_never_speculate_and_stay_exact(ranks):
    def fn(r):
        for step in range(12):
            _check(_step(r, step, ["a"] if step % 2 else ["b"]), 3, step)
        spec = context.thread.comm.agreement.spec
        return spec.hits, spec.misses
    for hits, misses in ranks(3).run(fn):
        assert hits == 0 and misses == 0      # {a}, {b}, {a}: never twice the same


def test_tensor_set_changing_mid_training(ranks):
    shapes = {"c": (9,)}

    def fn(r):
        spec = context.thread.comm.agreement.spec
        phases = [["a"], ["a", "b"], ["c"], ["c"]]
        hits = []
        step = 0
        for names, steps in zip(phases, (8, 5, 5, 5)):  # 'a' arms by step 2: >= 2 hits
            for _ in range(steps):                     # even if a slow step misses one
                _check(_step(r, step, names, shapes), 2, step, shapes)
                step += 1
            hits.append(spec.hits)
        for _ in range(5):                    # 'c' changes shape on every rank
            shp = {"c": (4, 2)}
            _check(_step(r, step, ["c"], shp), 2, step, shp)
            step += 1
        return hits, spec.hits
    for hits, total in ranks(2).run(fn):
        assert hits[0] >= 2 and hits[3] > hits[2] and total > hits[3]


def test_an_idle_rank_joins_with_zero_votes_and_nothing_is_lost(ranks):
    """A rank that pauses past IDLE_S joins the speculative messages with zeros; the
    others' data is discarded, not summed, and the step completes exactly."""
    def fn(r):
        spec = context.thread.comm.agreement.spec
        for step in range(5):
            _check(_step(r, step, ["g"]), 2, step)
        if r == 1:
            time.sleep(0.2)                   # > IDLE_S, < stale_s (0.05 x 30 s)
        _check(_step(r, 5, ["g"]), 2, 5)
        for step in range(6, 10):
            _check(_step(r, step, ["g"]), 2, step)
        return spec.misses, spec.idle, spec.hits
    results = ranks(2, NETREDUCE_TIMEOUT=30).run(fn)
    assert results[0][0] >= 1                 # rank 0's speculation met rank 1's zeros


def test_async_submissions_complete_without_a_wait(ranks):
    """A submission that completes the speculative group is not handed to the
    executor (the waiting user thread runs it): without a wait, the executor's poll
    still runs it."""
    def fn(r):
        for step in range(6):
            _check(_step(r, step, ["g"]), 2, step)
        for step in range(6, 10):
            h = nr.allreduce_async(_data(r, step, "g"), op=nr.Sum, name="g")
            deadline = time.monotonic() + 10
            while not nr.poll(h) and time.monotonic() < deadline:
                time.sleep(0.0005)
            assert nr.poll(h), "an async step never ran"
            _check({"g": nr.synchronize(h)}, 2, step)
        return context.thread.comm.agreement.spec.hits
    for hits in ranks(2).run(fn):
        assert hits >= 4


def test_one_call_steps_leave_the_executor_unpolled_and_an_async_step_still_runs(ranks):
    """Synchronous one-call steps (Agreement.steady) leave nothing to a wait, so the
    executor does not poll for one (a wake-up every POLL_S for nothing); an async
    step after them, that nobody waits for, still runs and is exact (route wakes the
    executor for it), and the steps after it are exact."""
    def fn(r):
        ag = context.thread.comm.agreement
        x = np.full(5, r + 1, np.float32)
        for _ in range(10):
            assert (nr.allreduce(x, op=nr.Sum, name="g") == 3).all()
        lone, steps = ag.spec.lone_hits, 0
        deadline = time.monotonic() + 1.5     # longer than the poll's 1 s window
        going = 2
        while going == 2:                       # the ranks stop at the same step
            go = np.full(5, 1.0 if time.monotonic() < deadline else 0.0, np.float32)
            going = int(nr.allreduce(go, op=nr.Sum, name="g")[0])
            steps += 1
        polled = ag.wakes.polls                 # set at the executor's every look
        lone = ag.spec.lone_hits - lone
        h = nr.allreduce_async(_data(r, 7, "g"), op=nr.Sum, name="g")
        deadline = time.monotonic() + 10
        while not nr.poll(h) and time.monotonic() < deadline:
            time.sleep(0.0005)
        assert nr.poll(h), "an async step never ran"
        _check({"g": nr.synchronize(h)}, 2, 7)
        for step in range(8, 12):
            _check(_step(r, step, ["g"]), 2, step)
        return polled, lone, steps
    for polled, lone, steps in ranks(2).run(fn):
        assert lone > 0, (lone, steps)
        # A step that found the executor issuing an idle message took the usual path
        # (a rank descheduled past IDLE_S under load): it may leave one to a wait.
        assert lone < steps or not polled, (lone, steps, polled)


@pytest.mark.parametrize("size", [2, 3])
def test_join_during_speculation(ranks, size):
    """Horovod's join: the joined rank votes nothing; the others' steps fall back and
    complete with its zeros."""
    def fn(r):
        steps = 4 if r == size - 1 else 10
        for step in range(steps):
            out = nr.allreduce(np.full(5, r + 1, np.float32), op=nr.Sum, name="g")
            want = sum(q + 1 for q in range(size)) if step < 4 else \
                sum(q + 1 for q in range(size - 1))
            assert (out == want).all(), (r, step, out)
        return nr.join()
    for last in ranks(size).run(fn):
        assert last in range(size)


def test_shutdown_while_speculating_ends_cleanly(ranks):
    """Rank 1 leaves with the speculation armed: its last speculative message says
    'other', the round after it says it leaves, rank 0 stops the agreement."""
    def fn(r):
        comm = context.thread.comm
        for step in range(6):
            _check(_step(r, step, ["g"]), 2, step)
        assert comm.agreement.spec.hits > 0
        if r == 1:
            comm.shutdown()
            return None
        deadline = time.monotonic() + 10
        while not comm.agreement.off and time.monotonic() < deadline:
            time.sleep(0.01)
        return comm.agreement.off, comm.failure()
    R = ranks(2)
    results = R.run(fn, shutdown=False)
    off, failure = results[0]
    assert off or failure is not None
    R.comms[0].shutdown()


def test_an_idle_job_backs_off_and_resumes(ranks):
    """Every message finding every rank with nothing for QUIET_S doubles the idle
    pace (up to max(IDLE_S, stale_s)); the next step resets it and is exact."""
    import threading
    from netreduce.worker.agreement import IDLE_S, QUIET_S
    both = threading.Barrier(2)

    def fn(r):
        ag = context.thread.comm.agreement
        for step in range(4):
            _check(_step(r, step, ["g"]), 2, step)
        # idle until this rank has backed off (QUIET_S of nothing, then a doubling; was a
        # fixed QUIET_S + 1.5 s), and the other rank too: a step before then would reset
        # the other's pace before it was seen
        deadline = time.monotonic() + QUIET_S + 10.0
        while ag.gap <= IDLE_S and time.monotonic() < deadline:
            time.sleep(0.01)
        both.wait(timeout=30.0)
        backed_off = ag.gap
        _check(_step(r, 4, ["g"]), 2, 4)
        return backed_off, ag.gap, ag.stale_s
    for backed_off, gap, stale_s in ranks(2, NETREDUCE_TIMEOUT=20).run(fn):
        assert IDLE_S < backed_off <= max(IDLE_S, stale_s)
        assert gap == IDLE_S


def test_first_log_entry_batched_with_its_wake_still_runs(ranks, monkeypatch):
    """A slow executor takes the first submission's wake and its log entry in one
    batch, before the rounds start: the entry must count as received (v[0]), or no
    round ever runs it (a livelock seen under load)."""
    from netreduce.worker.wake_queue import WakeQueue

    take = WakeQueue.take

    def slow_take(q, wait):
        if wait is None:                      # the plain executor, before the rounds
            deadline = time.monotonic() + 2.0
            while q.qsize() < 2 and time.monotonic() < deadline:
                time.sleep(0.001)
        return take(q, wait)
    monkeypatch.setattr(WakeQueue, "take", slow_take)

    def fn(r):
        for step in range(3):
            _check(_step(r, step, ["g"]), 2, step)
        return True
    assert ranks(2, NETREDUCE_TIMEOUT=10).run(fn, timeout=30) == [True, True]
