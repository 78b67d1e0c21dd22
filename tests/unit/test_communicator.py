"""The public API end to end, ranks as threads, on the fake server and fabric
(the same scenarios run as processes on the real data plane in tests/parallel): the
values, the arguments refused, fusion and the timeline. Failures:
test_communicator_failures.py; init again: test_communicator_init.py; join:
test_communicator_join.py."""
import json
import random

import numpy as np
import pytest

import netreduce as nr
from netreduce.worker import context
from netreduce.errors import NegotiationError


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_rank_r_contributes_r(ranks, size):
    def fn(r):
        out = [nr.allreduce(np.full(n, r, np.float32), op=nr.Sum, name=f"t{n}")
               for n in (0, 1, 1000, 70000)]
        avg = nr.allreduce(np.full(7, r, np.float64))
        return out, avg
    for out, avg in ranks(size).run(fn):
        for a in out:
            assert (a == size * (size - 1) / 2).all()
        assert np.allclose(avg, (size - 1) / 2)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64", "int8",
                                   "uint8"])
def test_random_data_against_numpy(ranks, dtype):
    size = 3
    data = [np.random.default_rng(r).integers(-20, 20, (5, 33)).astype(dtype)
            for r in range(size)]

    def fn(r):
        return (nr.allreduce(data[r], op=nr.Sum, name="s"),
                nr.allreduce(data[r], op=nr.Min, name="mn"),
                nr.allreduce(data[r], op=nr.Max, name="mx"))
    for s, mn, mx in ranks(size).run(fn):
        np.testing.assert_array_equal(s, np.sum(data, axis=0).astype(dtype))
        np.testing.assert_array_equal(mn, np.min(data, axis=0))
        np.testing.assert_array_equal(mx, np.max(data, axis=0))
        assert s.dtype == np.dtype(dtype)


def test_bfloat16_through_uint16(ranks):
    vals = np.array([1.0, 2.0, -0.5], np.float32)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16)

    def fn(r):
        return nr.allreduce(bits, op=nr.Average, name="bf", dtype="bfloat16")
    for out in ranks(2).run(fn):
        assert ((out.astype(np.uint32) << 16).view(np.float32) == vals).all()


def test_fifty_tensors_in_a_different_random_order_per_rank(ranks):
    size = 4
    shapes = {f"g{i}": (i % 7 + 1, 3) for i in range(50)}

    def fn(r):
        names = list(shapes)
        random.Random(r).shuffle(names)
        handles = {n: nr.allreduce_async(np.full(shapes[n], r + int(n[1:]), np.float32),
                                         op=nr.Sum, name=n) for n in names}
        return {n: nr.synchronize(h) for n, h in handles.items()}
    R = ranks(size)
    for got in R.run(fn):
        for n, arr in got.items():
            assert (arr == sum(r + int(n[1:]) for r in range(size))).all(), n


def test_prescale_postscale_average(ranks):
    def fn(r):
        a = nr.allreduce(np.full(4, r + 1, np.float32), name="a", prescale_factor=2.0,
                         postscale_factor=0.5)
        b = nr.allreduce(np.full(4, r + 1, np.int32), op=nr.Sum, name="b", prescale_factor=0.5)
        g = nr.grouped_allreduce([np.ones(3, np.float32) * r, np.ones(5, np.float32)], op=nr.Sum,
                                 name="g", postscale_factor=10.0)
        return a, b, g
    for a, b, g in ranks(2).run(fn):
        assert (a == 1.5).all()            # ((1+2)*2/2)*0.5 = 1.5
        assert (b == 0 + 1).all()          # int(1*0.5)=0, int(2*0.5)=1
        assert (g[0] == 10).all() and (g[1] == 20).all()


def test_in_place_and_broadcast_and_objects(ranks):
    def fn(r):
        x = np.full(6, r, np.float32)
        y = nr.allreduce_(x, op=nr.Sum, name="x")
        b = nr.broadcast(np.arange(5) * (r + 1), root_rank=1, name="b")
        c = np.full(3, r, np.float64)
        nr.broadcast_(c, root_rank=2)
        obj = nr.broadcast_object({"from": r}, root_rank=1)
        everyone = nr.allgather_object(("r", r, "x" * r))
        nr.barrier()
        return y is x, x, b, c, obj, everyone
    for same, x, b, c, obj, everyone in ranks(3).run(fn):
        assert same and (x == 3).all()
        assert (b == np.arange(5) * 2).all() and (c == 2).all()
        assert obj == {"from": 1}
        assert everyone == [("r", r, "x" * r) for r in range(3)]


def test_mismatched_shapes_fail_on_every_rank(ranks):
    def fn(r):
        with pytest.raises(NegotiationError) as info:
            nr.allreduce(np.zeros((2, 3) if r == 0 else (3,), np.float32), name="bad")
        # the communicator keeps working afterwards
        return str(info.value), nr.allreduce(np.ones(2, np.float32), op=nr.Sum, name="ok")
    for msg, ok in ranks(2).run(fn):
        assert "Mismatched allreduce tensor shapes: One rank sent a tensor of shape [2, 3], " \
               "but another rank sent a tensor of shape [3]" in msg
        assert "'bad'" in msg and "rank 0" in msg and "rank 1" in msg
        assert (ok == 2).all()


def test_mismatched_dtype_and_op(ranks):
    def fn(r):
        with pytest.raises(nr.NetReduceError, match="Mismatched data types"):
            nr.allreduce(np.zeros(3, np.float32 if r else np.float64), name="d")
        with pytest.raises(nr.NetReduceError, match="Mismatched allreduce reduction ops"):
            nr.allreduce(np.zeros(3), op=nr.Sum if r else nr.Max, name="o")
    ranks(2).run(fn)


def test_duplicate_in_flight_name_is_a_value_error(ranks):
    def fn(r):
        h = nr.allreduce_async(np.ones(3, np.float32), name="dup")
        with pytest.raises(ValueError, match="'dup' is already being reduced"):
            nr.allreduce_async(np.ones(3, np.float32), name="dup")
        nr.synchronize(h)
        nr.synchronize(nr.allreduce_async(np.ones(3, np.float32), name="dup"))  # fine now
        with pytest.raises(ValueError, match="already being reduced"):
            nr.grouped_allreduce_async([np.ones(1)], name="same") and \
                nr.grouped_allreduce_async([np.ones(1), np.ones(1)], name="same")
    ranks(1).run(fn)


def test_bad_arguments(ranks):
    def fn(r):
        with pytest.raises(ValueError, match="C-contiguous"):
            nr.allreduce(np.zeros((3, 3), np.float32).T, name="t")
        with pytest.raises(NotImplementedError):
            nr.allreduce(np.zeros(3), op=nr.ReduceOp.Adasum)
        with pytest.raises(ValueError, match="root_rank 5"):
            nr.broadcast(np.zeros(3), root_rank=5)
        with pytest.raises(TypeError, match="cannot all-reduce dtype"):
            nr.allreduce(np.zeros(3, np.complex64))
    ranks(1).run(fn)


def test_not_initialized():
    assert not nr.is_initialized()
    with pytest.raises(nr.NetReduceError, match="not been initialized"):
        nr.allreduce(np.zeros(1))
    with pytest.raises(nr.NetReduceError, match="not been initialized"):
        nr.rank()


def test_fusion_buffer_allocated_once_and_cache_makes_steps_cheap(ranks):
    shapes = [(64, 3, 3), (64,), (128, 64), (128,), (10, 128), (10,)]

    def fn(r):
        comm = context.thread.comm
        for step in range(6):
            if step == 1:
                first = comm.neg.requests
            handles = [nr.allreduce_async(np.full(s, r, np.float32), op=nr.Sum, name=f"p{i}")
                       for i, s in enumerate(shapes)]
            for h in handles:
                nr.synchronize(h)
        return (comm.fusion.allocations, comm.cache.hits, comm.groups_executed,
                (comm.neg.requests - first) / 5)
    R = ranks(2, NETREDUCE_CYCLE_TIME=20)
    for allocations, hits, groups, requests_per_step in R.run(fn):
        assert allocations == 1
        assert hits >= 5 * len(shapes)           # after step 0 every name is an id
        assert groups <= 6 * 2                   # ≤ 2 fused messages per step, not 6
        # One small negotiation message per step, not one per tensor (6). A loaded
        # machine can split a step's submissions over two cycles, or expire a long
        # poll while the other rank is descheduled: at most one extra message.
        assert requests_per_step <= 2
    sizes = {c[2] for c in R.fabric.calls}
    assert sum(int(np.prod(s)) for s in shapes) in sizes  # one fused message per step


def test_timeline_has_every_phase(ranks, tmp_path):
    path = tmp_path / "trace.json"

    def fn(r):
        for step in range(2):
            nr.grouped_allreduce([np.ones(10, np.float32), np.ones(3, np.float32)], name="g")
    ranks(2, NETREDUCE_TIMELINE=str(path)).run(fn)
    events = json.loads(path.read_text())
    phases = {e["name"] for e in events if e["ph"] == "X"}
    # step 0 through the coordinator, step 1 agreed by the ranks' rounds (cached)
    assert phases == {"negotiate", "wait_for_ranks", "queued", "round", "copy_in", "allreduce",
                      "copy_out"}
    rows = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert rows == {"g.0", "g.1", "(agreement rounds)"}
    assert all(e["dur"] >= 0 and e["pid"] == 0 for e in events if e["ph"] == "X")
