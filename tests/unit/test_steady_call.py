"""A named synchronous all-reduce in the steady state runs in one call on the user's
thread (Agreement.steady, Speculation.run_lone): the same speculative message the
submission and its wait would issue, with no Tensor, Handle or hand-off. Ranks as
threads on the fakes, whose fabric fails any message that differs between ranks, so
every test also checks that the one-call path and the usual one send the same
messages in the same order."""
import threading
import time

import numpy as np
import pytest

import netreduce as nr
from netreduce.errors import DataPlaneError, InvalidArgumentError, NetReduceError
from netreduce.worker import context


def _data(r, step, shape=(5,), dtype=np.float32):
    """Integers (exact sums in any order) that differ per rank and step."""
    return np.random.default_rng(r * 1000 + step).integers(-50, 50, shape).astype(dtype)


def _want(size, step, shape=(5,), dtype=np.float32):
    return sum(_data(r, step, shape, dtype) for r in range(size))


def _spec():
    return context.thread.comm.agreement.spec


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("dtype,shape", [(np.float32, (5,)), (np.float64, (2, 3)),
                                         (np.float32, ())])
def test_steady_calls_take_one_call_and_are_exact(ranks, size, dtype, shape):
    def fn(r):
        for step in range(16):
            x = _data(r, step, shape, dtype)
            if step % 2:
                out = nr.allreduce_(x, op=nr.Sum, name="g")
                assert out is x
            else:
                out = nr.allreduce(x, op=nr.Sum, name="g")
            want = _want(size, step, shape, dtype)
            assert out.dtype == want.dtype and out.shape == want.shape
            assert np.array_equal(out, want), (r, step, out, want)
        return _spec().lone_hits, context.thread.comm.neg.requests
    for lone_hits, requests in ranks(size).run(fn):
        assert lone_hits >= 4                 # steps 3.. in one call (load may miss some)
        assert requests <= 2                  # the first step's negotiation only


def test_average_and_postscale_as_on_the_usual_path(ranks):
    """Average divides by N, postscale multiplies: the one-call copy-out is the
    group's own (powers of two: exact)."""
    def fn(r):
        outs = []
        for step in range(12):
            outs.append(nr.allreduce(_data(r, step), op=nr.Average, name="avg",
                                     postscale_factor=0.5))
        return outs, _spec().lone_hits
    results = ranks(2).run(fn)
    for step in range(12):
        want = _want(2, step) * np.float32(0.25)
        for outs, _ in results:
            assert np.array_equal(outs[step], want), (step, outs[step], want)
    assert all(hits >= 4 for _, hits in results)


def test_a_steady_name_called_another_way_follows_the_call(ranks):
    """api._steady reuses a name's last ReduceOp and signature only for the very same
    call: the op given another way (a name, Horovod's integer), a postscale of another
    value or type, and a mutable factor changed in place each do what the call says."""
    factor = np.array(1.0)                    # 0-d: unhashable, changed in place below

    def fn(r):
        outs = []
        for step in range(30):
            x, phase = _data(r, step), min(step // 6, 3)
            if phase == 0:
                out = nr.allreduce(x, op=nr.Sum, name="g")
            elif phase == 1:
                out = nr.allreduce(x, op="sum" if step % 2 else 1, name="g")  # 1: Horovod's Sum
            elif phase == 2:
                out = nr.allreduce(x, op=nr.Sum, name="g", postscale_factor=2.0 if step % 2 else 2)
            else:
                if r == 0:              # steady at 3, then 0.5 under the same object
                    factor[...] = 3.0 if step < 26 else 0.5
                ranks_barrier()
                out = nr.allreduce(x, op=nr.Sum, name="g", postscale_factor=factor)
                ranks_barrier()
            outs.append(out)
        return outs, _spec().lone_hits
    ranks_barrier = threading.Barrier(2).wait
    results = ranks(2).run(fn)
    for step in range(30):
        scale = (1, 1, 2, 3.0 if step < 26 else 0.5)[min(step // 6, 3)]
        want = _want(2, step) * np.float32(scale)
        for outs, _ in results:
            assert np.array_equal(outs[step], want), (step, outs[step], want)
    assert all(hits >= 4 for _, hits in results)


def test_one_call_and_usual_paths_mix_across_ranks(ranks):
    """Rank 0 calls allreduce (one call), rank 1 allreduce_async + synchronize (the
    usual path), rank 2 allreduce_: the same messages on every rank, exact results."""
    def fn(r):
        for step in range(14):
            x = _data(r, step)
            if r == 0:
                out = nr.allreduce(x, op=nr.Sum, name="g")
            elif r == 1:
                out = nr.synchronize(nr.allreduce_async(x, op=nr.Sum, name="g"))
            else:
                out = nr.allreduce_(x, op=nr.Sum, name="g")
            assert np.array_equal(out, _want(3, step)), (r, step, out)
        spec = _spec()
        return spec.lone_hits, spec.hits
    results = ranks(3).run(fn)
    assert results[0][0] >= 4 and results[2][0] >= 4
    assert results[1][0] == 0 and results[1][1] >= 4  # speculative, but not in one call


def test_a_late_rank_turns_a_steady_call_into_a_round(ranks):
    """Rank 1 pauses past IDLE_S: its executor joins rank 0's one-call message with a
    zero vote; rank 0's submission then waits for the round as a usual one would,
    the step is exact, and the one-call steps resume."""
    def fn(r):
        spec = _spec()
        for step in range(6):
            assert np.array_equal(nr.allreduce(_data(r, step), op=nr.Sum, name="g"), _want(2, step))
        if r == 1:
            time.sleep(0.2)                   # > IDLE_S, < stale_s (0.05 x 30 s)
        before = spec.lone_hits
        for step in range(6, 16):
            assert np.array_equal(nr.allreduce(_data(r, step), op=nr.Sum, name="g"), _want(2, step))
        return spec.misses, before, spec.lone_hits
    results = ranks(2, NETREDUCE_TIMEOUT=30).run(fn)
    assert results[0][0] >= 1                 # rank 0's one-call message met rank 1's zeros
    assert all(after > before for _, before, after in results)


def test_a_name_in_flight_is_still_refused(ranks):
    """A steady name with an asynchronous submission still in flight: the second
    submission is refused as on the usual path, and the first completes. Rank 1
    submits its part only after rank 0's refusal: else a rank 0 descheduled between
    its two calls (a loaded host) found the first complete, its second call ran as a
    step that rank 1, gone, never joined."""
    refused = threading.Event()

    def fn(r):
        for step in range(6):
            nr.allreduce(_data(r, step), op=nr.Sum, name="g")
        if r == 1:
            assert refused.wait(30)
        h = nr.allreduce_async(_data(r, 6), op=nr.Sum, name="g")
        if r == 0:
            try:
                with pytest.raises(InvalidArgumentError, match="already being reduced"):
                    nr.allreduce(_data(r, 7), op=nr.Sum, name="g")
            finally:
                refused.set()
        return np.array_equal(nr.synchronize(h), _want(2, 6))
    assert ranks(2).run(fn) == [True, True]


def test_a_data_plane_failure_in_a_steady_call_names_the_rank_and_tensor(ranks):
    """Rank 0's data plane fails inside a one-call step: rank 0's call raises the
    job's error naming its rank and the tensor; rank 1 fails too, nothing hangs."""
    def fn(r):
        comm = context.thread.comm
        spec = comm.agreement.spec
        for step in range(8):
            nr.allreduce(_data(r, step), op=nr.Sum, name="grad")
        assert spec.lone_hits >= 2
        if r == 0:
            real = comm.dp.allreduce

            def broken(src, *a, **k):
                if src.size == 7 and src.dtype == np.float32:  # the steady message: vote, other, 5
                    raise DataPlaneError("aggregator 10.0.0.9:4791, job 'job': injected loss")
                return real(src, *a, **k)
            comm.dp.allreduce = broken
        try:
            for step in range(8, 40):
                nr.allreduce(_data(r, step), op=nr.Sum, name="grad")
        except NetReduceError as exc:
            return exc
        return None
    R = ranks(2, NETREDUCE_TIMEOUT=10)
    errors = R.run(fn, timeout=60)
    assert isinstance(errors[0], NetReduceError), errors
    assert "rank 0" in str(errors[0]) and "'grad'" in str(errors[0]), errors[0]
    assert "injected loss" in str(errors[0])
    assert isinstance(errors[1], NetReduceError), errors
