"""The trimmed per-step Python (issue 15): the signature cache in api.py, the handle's
cheap completion flag (done_flag.py), the speculative copies precomputed at arming.
What they skip must not change what a user sees: a changed shape or dtype under a
cached name is still a mismatch, bad input is still refused with its message."""
import threading
import time

import numpy as np
import pytest

import netreduce as nr
from netreduce import api
from netreduce.worker import context
from netreduce.worker.handle import Handle
from netreduce.worker.done_flag import DoneFlag
from netreduce.errors import InvalidArgumentError, InvalidTypeError, NegotiationError, \
    OperationTimeoutError


def _uncached(kind, a, op, pre, post, root, dtype):
    return (kind, nr.ops.dtype_name(a, dtype), tuple(int(d) for d in a.shape),
            op.value if op else "", float(pre), float(post), int(root))


@pytest.mark.parametrize("a,dtype,pre,post", [
    (np.ones(4, np.float32), None, 1.0, 1.0),
    (np.ones((2, 3), np.float64), None, 0.5, 2),
    (np.ones(4, np.uint16), "bfloat16", 1, 1.0),
    (np.ones((), np.int8), None, True, 3.0),
    (np.ones(4, np.float32), None, np.float32(0.25), np.float64(4.0)),
])
def test_cached_signature_is_the_one_built_from_scratch(a, dtype, pre, post):
    for _ in range(2):  # a miss, then a hit
        assert api._sig("allreduce", a, nr.Sum, pre, post, -1, dtype) == \
            _uncached("allreduce", a, nr.Sum, pre, post, -1, dtype)


def test_signature_follows_shape_dtype_op_and_factors():
    base = api._sig("allreduce", np.ones(4, np.float32), nr.Sum, 1.0, 1.0, -1, None)
    for a, op, pre in [(np.ones(5, np.float32), nr.Sum, 1.0), (np.ones((4, 1), np.float32),
                       nr.Sum, 1.0), (np.ones(4, np.float64), nr.Sum, 1.0),
                       (np.ones(4, np.float32), nr.Average, 1.0),
                       (np.ones(4, np.float32), nr.Sum, 2.0)]:
        sig = api._sig("allreduce", a, op, pre, 1.0, -1, None)
        assert sig != base and sig == _uncached("allreduce", a, op, pre, 1.0, -1, None)


def test_unhashable_factor_is_built_not_kept():
    before = len(api._SIGS)
    sig = api._sig("allreduce", np.ones(3, np.float32), nr.Sum, np.array(2.0), 1.0, -1, None)
    assert sig[4] == 2.0 and len(api._SIGS) == before


def test_bad_input_is_refused_after_the_same_signature_was_cached(ranks):
    def fn(r):
        x = np.ones((4, 8), np.float32)
        for _ in range(3):
            nr.allreduce(x, op=nr.Sum, name="g")
        with pytest.raises(InvalidArgumentError, match="C-contiguous"):
            nr.allreduce(x[:, ::2], op=nr.Sum, name="g")
        with pytest.raises(InvalidTypeError, match="cannot all-reduce dtype complex64"):
            nr.allreduce(x.astype(np.complex64), op=nr.Sum, name="g")
        with pytest.raises(InvalidTypeError, match="'bfloat16' needs 2-byte elements"):
            nr.allreduce(x, op=nr.Sum, name="g", dtype="bfloat16")
        with pytest.raises(NotImplementedError, match="Adasum"):
            nr.allreduce(x, op=nr.Adasum, name="g")
        with pytest.raises(ValueError):
            nr.allreduce(x, op=nr.Sum, name="g", prescale_factor="x")
        return nr.allreduce(x, op=nr.Sum, name="g")  # nothing was lost: still works
    for out in ranks(1).run(fn):
        assert (out == 1).all()


@pytest.mark.parametrize("change", ["shape", "dtype"])
def test_changed_signature_under_a_cached_name_is_still_a_mismatch(ranks, change):
    """Steady (speculative) steps of 'g', then rank 1 changes its shape or dtype under
    the same name: both ranks get the coordinator's mismatch error, then go on."""
    def fn(r):
        for _ in range(6):
            nr.allreduce(np.ones(4, np.float32), op=nr.Sum, name="g")
        odd = np.ones(5 if change == "shape" else 4,
                      np.float64 if change == "dtype" and r == 1 else np.float32)
        if change == "shape" and r == 0:
            odd = np.ones(4, np.float32)
        with pytest.raises(NegotiationError) as info:
            nr.allreduce(odd, op=nr.Sum, name="g")
        return str(info.value), nr.allreduce(np.ones(4, np.float32), op=nr.Sum, name="g")
    for msg, again in ranks(2, NETREDUCE_TIMEOUT=20).run(fn):
        want = "Mismatched allreduce tensor shapes" if change == "shape" else \
            "Mismatched data types"
        assert want in msg and "'g'" in msg
        assert (again == 2).all()


def test_done_flag_wakes_a_blocked_waiter_and_times_out():
    flag = DoneFlag()
    assert flag.wait(0.01) is False and not flag.is_set()
    woke = []
    waiter = threading.Thread(target=lambda: woke.append(flag.wait()))
    waiter.start()
    time.sleep(0.05)  # the waiter is (most likely) blocked in its Event by now
    flag.set()
    waiter.join(5)
    assert woke == [True] and flag.is_set() and flag.wait(0) is True


def test_handle_wait_times_out_naming_the_tensor_then_completes():
    h = Handle([np.zeros(2)], False)
    h._names.append("w")
    with pytest.raises(OperationTimeoutError, match="tensor 'w' still in flight"):
        h.wait(0.01)
    threading.Timer(0.05, h._finish_one).start()
    assert h.wait() is h._outputs[0] and h.done()
    assert Handle([], True).done()   # nothing to wait for


@pytest.mark.parametrize("case,shape", [("average_post", (33,)), ("average_post", (3, 4)),
                                        ("average_post", ()), ("prescale", (2, 5)),
                                        ("sum", (4, 1, 2)), ("int8", (7,))])
def test_speculative_copies_match_the_plain_path(ranks, case, shape):
    """Average with a post-scale (the precomputed multiply), Sum (a plain copy out), a
    pre-scale (the general copy-in), int8 (the general copy-out), in several shapes:
    the speculative steps give what the first, negotiated step gave, bit for bit, on
    every rank."""
    def fn(r):
        rng = np.random.default_rng(r)
        if case == "int8":
            x, kw = rng.integers(-9, 9, shape).astype(np.int8), {"op": nr.Sum}
        elif case == "sum":
            x, kw = rng.standard_normal(shape), {"op": nr.Sum}
        else:
            x = rng.standard_normal(shape).astype(np.float32)
            kw = {"op": nr.Average, "postscale_factor": 3.0} if case == "average_post" \
                else {"op": nr.Sum, "prescale_factor": 0.5}
        outs = [nr.allreduce(x, name="t", **kw) for _ in range(12)]
        return outs, context.thread.comm.agreement.spec.hits
    results = ranks(2).run(fn)
    for outs, hits in results:
        assert hits >= 3                      # steps 3.. are speculative (load may miss)
        for got in outs[1:]:
            assert got.dtype == outs[0].dtype and got.shape == shape
            assert np.array_equal(got, outs[0])
    assert np.array_equal(results[0][0][-1], results[1][0][-1])
