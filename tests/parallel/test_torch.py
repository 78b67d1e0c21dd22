"""netreduce.torch's Horovod-compatible API, checked the way Horovod's own
test/parallel/test_torch.py checks horovod.torch.

These tests run on every rank at once (``netreduce-run -np N -- python -m pytest
tests/parallel/test_torch.py``); tests/parallel/test_torch_launch.py starts them with
2 and 3 ranks. Run directly without a launcher they are skipped.
"""
import itertools
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.parallel.launched import LAUNCHED, initialized_by, only_when_launched_by  # noqa: E402

pytestmark = only_when_launched_by("tests/parallel/test_torch_launch.py")

if LAUNCHED:
    import netreduce.torch as hvd
    from netreduce.torch import mpi_ops

DTYPES = [torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]
DIMS = [1, 2, 3]


initialized = initialized_by("netreduce.torch")


def _random(dim, dtype, seed=1234):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-100, 100, [17] * dim, generator=gen).to(dtype)


def _close(actual, expected, dtype, size):
    if dtype in (torch.int32, torch.int64):
        return torch.equal(actual, expected)
    tol = 1e-3 * size if dtype == torch.float16 else 1e-6
    return torch.allclose(actual.double(), expected.double(), rtol=tol, atol=tol)


# --- allreduce ---------------------------------------------------------------------
def test_allreduce_sum():
    size = hvd.size()
    for dtype, dim in itertools.product(DTYPES, DIMS):
        tensor = _random(dim, dtype)
        summed = hvd.allreduce(tensor, op=hvd.Sum)
        assert summed.dtype == dtype and summed.shape == tensor.shape
        assert _close(summed, tensor * size, dtype, size), (dtype, dim)


def test_allreduce_average():
    for dtype, dim in itertools.product(DTYPES, DIMS):
        tensor = _random(dim, dtype)
        averaged = hvd.allreduce(tensor)  # Average is the default
        assert _close(averaged, tensor, dtype, hvd.size()), (dtype, dim)


@pytest.mark.parametrize("op,fn", [("Min", torch.min), ("Max", torch.max)])
def test_allreduce_min_max(op, fn):
    size, rank = hvd.size(), hvd.rank()
    for dtype, dim in itertools.product(DTYPES, DIMS):
        every = torch.stack([_random(dim, dtype, seed=100 + r) for r in range(size)])
        result = hvd.allreduce(every[rank].clone(), op=getattr(hvd, op))
        assert torch.equal(result, fn(every, dim=0).values), (op, dtype, dim)


def _factors(dim, dtype, seed):
    """Horovod's test_horovod_allreduce_product data is random integers; small ones
    keep a product over 3 ranks exact in float16 and inside int32."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-9, 10, [17] * dim, generator=gen).to(dtype)


def test_allreduce_product():
    size, rank = hvd.size(), hvd.rank()
    for dtype, dim in itertools.product(DTYPES, DIMS):
        every = torch.stack([_factors(dim, dtype, seed=200 + r) for r in range(size)])
        result = hvd.allreduce(every[rank].clone(), op=hvd.Product, name=f"prod.{dtype}.{dim}")
        assert result.dtype == dtype and result.shape == every[rank].shape
        assert torch.equal(result, torch.prod(every, dim=0)), (dtype, dim)


def test_allreduce_product_async_fused_and_integer_op():
    """Fused async submissions (Horovod's op value 5 is Product): poll() is False until
    the last rank has submitted, every tensor gets its own product."""
    size, rank = hvd.size(), hvd.rank()
    tensors = [torch.full((5 + i,), float(rank + 1)) for i in range(4)]

    def submit():
        return [hvd.allreduce_async(t, op=5, name=f"prod.async.{i}") for i, t in enumerate(tensors)]
    if rank == 0:  # the others submit only after the gate below, which needs rank 0
        handles = submit()
        assert not all(hvd.poll(h) for h in handles), "poll() True before the others submitted"
    hvd.allreduce(torch.ones(1), name="prod.async.gate")
    if rank != 0:
        handles = submit()
    expected = float(np.prod(np.arange(1, size + 1)))
    for i, h in enumerate(handles):
        assert torch.all(hvd.synchronize(h) == expected), i


def test_allreduce_horovod_integer_ops():
    """Code written against horovod.torch may pass its integer op values."""
    rank, size = hvd.rank(), hvd.size()
    tensor = torch.full((9,), float(rank + 1))
    for op, expected in ((0, (size + 1) / 2), (1, size * (size + 1) / 2), (3, 1), (4, size)):
        assert torch.all(hvd.allreduce(tensor, op=op) == expected), op
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(tensor, op=2)


def test_allreduce_inplace():
    size = hvd.size()
    for dtype, dim in itertools.product(DTYPES, DIMS):
        tensor = _random(dim, dtype)
        expected = tensor * size
        out = hvd.allreduce_(tensor, op=hvd.Sum)
        assert out is tensor
        assert _close(tensor, expected, dtype, size), (dtype, dim)


def _storage(tensor):
    """A numpy view of ``tensor``'s own memory (bfloat16 has no numpy dtype)."""
    return (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy()


def test_allreduce_cpu_is_zero_copy(monkeypatch):
    """A contiguous CPU tensor reaches the core as a view of its own memory, in place
    and out of place, and an in-place result is not copied back (it is already there):
    the array the core receives is recorded, and _Buf.to_tensor (the copy-back path)
    must not run for in-place ops."""
    size = hvd.size()
    seen, copies = [], []
    core_allreduce_async, to_tensor = mpi_ops._nr.allreduce_async, mpi_ops._Buf.to_tensor

    def recording(array, *args, **kwargs):
        seen.append(array)
        return core_allreduce_async(array, *args, **kwargs)

    def counting(buf, result):
        copies.append(buf)
        return to_tensor(buf, result)
    monkeypatch.setattr(mpi_ops._nr, "allreduce_async", recording)
    monkeypatch.setattr(mpi_ops._Buf, "to_tensor", counting)
    dtypes = [torch.float32, torch.int64, torch.float16]
    if mpi_ops._CORE_BF16:
        dtypes.append(torch.bfloat16)
    for dtype in dtypes:
        tensor = torch.ones(1000, dtype=dtype)
        ptr = tensor.data_ptr()
        handle = hvd.allreduce_async_(tensor, op=hvd.Sum)
        assert len(seen) == 1 and np.shares_memory(seen[-1], _storage(tensor)), dtype
        assert hvd.synchronize(handle) is tensor
        hvd.allreduce_(tensor, op=hvd.Sum)
        assert len(seen) == 2 and np.shares_memory(seen[-1], _storage(tensor)), dtype
        assert not copies, f"{dtype}: in-place result copied back into the tensor"
        assert tensor.data_ptr() == ptr and torch.all(tensor == size * size), dtype
        # out of place: the input is read where it is, the result is a new tensor
        out = hvd.allreduce(tensor, op=hvd.Sum)
        assert len(seen) == 3 and np.shares_memory(seen[-1], _storage(tensor)), dtype
        assert not np.shares_memory(_storage(out), _storage(tensor))
        assert torch.all(tensor == size * size) and torch.all(out == size ** 3), dtype
        seen.clear()
        copies.clear()


def test_allreduce_reaches_the_core_without_detach(monkeypatch):
    """A tensor that needs no gradient (every gradient in a hook) reaches the core as
    its own numpy view with no detach(): torch drops the GIL in detach(), and in a
    gradient hook the executor thread took it there (a wait per call). One that needs
    a gradient is still detached; both results exact."""
    detached = []
    detach = torch.Tensor.detach

    def counting(self, *args, **kwargs):
        detached.append(self)
        return detach(self, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, "detach", counting)
    plain = torch.ones(100)
    handle = hvd.allreduce_async_(plain, op=hvd.Sum)
    assert not detached
    leaf = torch.ones(100, requires_grad=True)
    out = hvd.allreduce_async(leaf, op=hvd.Sum)
    assert len(detached) == 1
    monkeypatch.undo()
    assert hvd.synchronize(handle) is plain and torch.all(plain == hvd.size())
    assert torch.all(hvd.synchronize(out) == hvd.size())


def test_allreduce_async_fused():
    size = hvd.size()
    pending, polled_false = [], False
    for dtype, dim in itertools.product(DTYPES, DIMS):
        tensor = _random(dim, dtype)
        handle = hvd.allreduce_async(tensor, op=hvd.Sum)
        if not hvd.poll(handle):
            polled_false = True
        pending.append((dtype, tensor * size, handle))
    assert polled_false, "hvd.poll() always returned True: not an asynchronous op?"
    for dtype, expected, handle in pending:
        assert _close(hvd.synchronize(handle), expected, dtype, size), dtype


@pytest.mark.parametrize("where", ["prescale_factor", "postscale_factor"])
def test_allreduce_scale_factors(where):
    size = hvd.size()
    factor = float(np.random.RandomState(7).uniform())  # same on every rank
    for dtype, dim in itertools.product(DTYPES, DIMS):
        tensor = _random(dim, dtype)
        result = hvd.allreduce(tensor, op=hvd.Sum, **{where: factor})
        if dtype in (torch.int32, torch.int64):
            # integers are scaled in float64 and truncated (Horovod's static_cast)
            if where == "prescale_factor":
                expected = (tensor.double() * factor).trunc().to(dtype) * size
            else:
                expected = (tensor.double() * size * factor).trunc().to(dtype)
        else:
            expected = tensor.double() * size * factor
        assert _close(result, expected, dtype, size), (where, dtype, dim)


def test_allreduce_bfloat16():
    tensor = torch.arange(100, dtype=torch.float32).bfloat16()
    summed = hvd.allreduce(tensor, op=hvd.Sum)
    assert summed.dtype == torch.bfloat16
    assert torch.equal(summed, (tensor.float() * hvd.size()).bfloat16())


def test_allreduce_shape_mismatch_raises_runtime_error():
    rank = hvd.rank()
    tensor = torch.zeros([17 + rank] * 3)
    with pytest.raises(RuntimeError) as info:
        hvd.allreduce(tensor, name="mismatch.shape")
    assert isinstance(info.value, hvd.NetReduceError)
    assert "mismatch" in str(info.value).lower()
    # same number of elements, different rank
    tensor = torch.zeros([17, 23 * 57] if rank == 0 else [17, 23, 57])
    with pytest.raises(RuntimeError):
        hvd.allreduce(tensor, name="mismatch.rank")


def test_allreduce_dtype_mismatch_raises_runtime_error():
    dtype = torch.int32 if hvd.rank() % 2 == 0 else torch.float32
    with pytest.raises(RuntimeError) as info:
        hvd.allreduce(torch.zeros([17] * 3, dtype=dtype), name="mismatch.dtype")
    assert "mismatch" in str(info.value).lower()


def test_allreduce_duplicate_name_raises_value_error():
    """A name stays in flight until its operation completes, which needs every rank's
    submission. The last rank holds back "dup.a" and the others hold back "dup.b"
    until all have passed "dup.go", so on every rank the second submission of its
    first name provably meets the first one still in flight."""
    rank, size = hvd.rank(), hvd.size()
    tensor = torch.ones(17)
    first, later = ("dup.b", "dup.a") if rank == size - 1 else ("dup.a", "dup.b")
    handle = hvd.allreduce_async(tensor, name=first, op=hvd.Sum)
    with pytest.raises(ValueError, match=f"'{first}' is already being reduced"):
        hvd.allreduce_async(tensor, name=first, op=hvd.Sum)
    with pytest.raises(ValueError, match=f"'{first}' is already being reduced"):
        hvd.allreduce_async_(tensor.clone(), name=first, op=hvd.Sum)
    assert not hvd.poll(handle), f"{first} completed before every rank submitted it"
    hvd.allreduce(torch.ones(1), name="dup.go")
    other = hvd.allreduce_async(tensor, name=later, op=hvd.Sum)
    assert torch.all(hvd.synchronize(handle) == size)
    assert torch.all(hvd.synchronize(other) == size)
    # completed: the names are free again
    assert torch.all(hvd.allreduce(tensor, name="dup.a", op=hvd.Sum) == size)


def test_allreduce_rejects_bad_tensors_locally():
    with pytest.raises(ValueError, match="dtype"):
        hvd.allreduce(torch.zeros(4, dtype=torch.complex64))
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce(torch.zeros(4, 4).t())
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce_(torch.zeros(4, 4)[:, 1])


def test_average_argument_is_deprecated():
    tensor = torch.ones(5)
    with pytest.warns(DeprecationWarning):
        result = hvd.allreduce(tensor, average=False)
    assert torch.all(result == hvd.size())
    with pytest.warns(DeprecationWarning):
        result = hvd.allreduce(tensor, average=True)
    assert torch.all(result == 1)
    with pytest.raises(ValueError):
        hvd.allreduce(tensor, average=True, op=hvd.Sum)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hvd.allreduce(tensor, op=hvd.Average)


@pytest.mark.parametrize("op,expected", [("Sum", "size"), ("Average", 1)])
def test_allreduce_grad(op, expected):
    size = hvd.size()
    for dtype, dim in itertools.product([torch.float32, torch.float64], DIMS):
        tensor = _random(dim, dtype).requires_grad_()
        reduced = hvd.allreduce(tensor, op=getattr(hvd, op))
        reduced.backward(torch.ones([17] * dim, dtype=dtype))
        want = np.ones([17] * dim) * (size if expected == "size" else 1)
        assert np.linalg.norm(want - tensor.grad.numpy()) < 1e-8


def test_allreduce_fp16_compression():
    tensor = torch.linspace(-1, 1, 301, dtype=torch.float32)
    result = hvd.allreduce(tensor, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert result.dtype == torch.float32
    assert torch.allclose(result, tensor * hvd.size(), atol=2e-3 * hvd.size())


# --- grouped allreduce ---------------------------------------------------------------
def test_grouped_allreduce():
    size = hvd.size()
    for dtype, dim in itertools.product(DTYPES, DIMS):
        tensors = [_random(dim, dtype, seed=s) for s in range(5)]
        summed = hvd.grouped_allreduce(tensors, op=hvd.Sum)
        for t, s in zip(tensors, summed):
            assert _close(s, t * size, dtype, size), (dtype, dim)
        averaged = hvd.grouped_allreduce(tensors)
        for t, a in zip(tensors, averaged):
            assert _close(a, t, dtype, size), (dtype, dim)


def test_grouped_allreduce_async_polls():
    """Out-of-place grouped all-reduce: poll until done, inputs untouched."""
    size = hvd.size()
    for dtype in DTYPES:
        tensors = [_random(dim, dtype, seed=dim) for dim in DIMS]
        before = [t.clone() for t in tensors]
        handle = hvd.grouped_allreduce_async(tensors, op=hvd.Sum)
        # a failed operation polls True too (NETREDUCE_TIMEOUT bounds the wait)
        while not hvd.poll(handle):
            time.sleep(0.001)
        outputs = hvd.synchronize(handle)
        assert len(outputs) == len(tensors)
        for t, b, out in zip(tensors, before, outputs):
            assert torch.equal(t, b), f"{dtype}: grouped_allreduce_async modified its input"
            assert out.dtype == dtype and out.shape == t.shape
            assert _close(out, b * size, dtype, size), dtype


def test_grouped_allreduce_inplace_and_async():
    size = hvd.size()
    tensors = [_random(2, torch.float32, seed=s) for s in range(4)]
    expected = [t * size for t in tensors]
    handle = hvd.grouped_allreduce_async_(tensors, op=hvd.Sum)
    outputs = hvd.synchronize(handle)
    for t, out, e in zip(tensors, outputs, expected):
        assert out is t and torch.equal(t, e)
    outputs = hvd.grouped_allreduce_(tensors, op=hvd.Average)
    for t, e in zip(outputs, expected):
        assert torch.equal(t, e)


def test_grouped_allreduce_mismatch_raises():
    rank = hvd.rank()
    tensors = [torch.zeros(17), torch.zeros([17 + rank] * 2)]
    with pytest.raises(RuntimeError):
        hvd.grouped_allreduce(tensors, name="grouped.mismatch")


def test_grouped_allreduce_grad():
    size = hvd.size()
    tensors = [_random(d, torch.float32, seed=d).requires_grad_() for d in DIMS]
    summed = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    for s in summed:
        s.backward(torch.ones_like(s))
    for t in tensors:
        assert torch.all(t.grad == size)


# --- broadcast -------------------------------------------------------------------------
BCAST_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.bool]


def test_broadcast():
    rank, size = hvd.rank(), hvd.size()
    for dtype, dim, root in itertools.product(BCAST_DTYPES, DIMS, range(size)):
        tensor = torch.ones([17] * dim).mul_(rank).to(dtype)
        root_tensor = torch.ones([17] * dim).mul_(root).to(dtype)
        before = tensor.clone()
        out = hvd.broadcast(tensor, root)
        assert torch.equal(tensor, before), "broadcast modified its input"
        assert torch.equal(out, root_tensor), (dtype, dim, root)


def test_broadcast_inplace():
    rank, size = hvd.rank(), hvd.size()
    for dtype, root in itertools.product(BCAST_DTYPES, range(size)):
        tensor = torch.ones([5, 7]).mul_(rank).to(dtype)
        out = hvd.broadcast_(tensor, root)
        assert out is tensor
        assert torch.equal(tensor, torch.ones([5, 7]).mul_(root).to(dtype)), (dtype, root)


def test_broadcast_async_polls():
    rank = hvd.rank()
    handles = [hvd.broadcast_async(torch.full((100,), float(rank + i)), 0, name=f"bcast.{i}")
               for i in range(6)]
    pending = set(handles)
    while pending:  # a failed operation polls True too (NETREDUCE_TIMEOUT bounds this)
        pending = {h for h in pending if not hvd.poll(h)}
        time.sleep(0.001)
    assert all(hvd.poll(h) for h in handles)  # done stays done until synchronize
    outs = [hvd.synchronize(h) for h in handles]
    for i, out in enumerate(outs):
        assert torch.all(out == float(i))


def test_broadcast_mismatch_raises():
    rank = hvd.rank()
    with pytest.raises(RuntimeError):
        hvd.broadcast(torch.zeros([17 + rank] * 3), 0, name="bcast.shape")
    with pytest.raises(RuntimeError):
        dtype = torch.int32 if rank % 2 == 0 else torch.float32
        hvd.broadcast(torch.zeros(17, dtype=dtype), 0, name="bcast.dtype")


def test_broadcast_rank_error():
    """Horovod's test_horovod_broadcast_rank_error: every rank names itself as root.
    Every rank gets a RuntimeError that lists each rank's root."""
    rank, size = hvd.rank(), hvd.size()
    tensor = torch.ones(17) * rank
    with pytest.raises(RuntimeError) as info:
        hvd.broadcast(tensor, rank)
    message = str(info.value)
    assert "Mismatched broadcast root ranks" in message
    for r in range(size):
        assert f"rank {r} sent {r}" in message, message
    assert torch.equal(tensor, torch.ones(17) * rank)
    # the failure is per operation: the next broadcast works
    assert torch.all(hvd.broadcast(tensor, 0) == 0)


def test_broadcast_grad():
    rank, size = hvd.rank(), hvd.size()
    for root in range(size):
        tensor = torch.ones(17, 17).mul_(rank).requires_grad_()
        out = hvd.broadcast(tensor, root)
        out.backward(torch.ones(17, 17))
        expected = 1.0 if rank == root else 0.0
        assert torch.all(tensor.grad == expected), root


# --- objects, barrier, join ---------------------------------------------------------------
def test_broadcast_and_allgather_object():
    rank, size = hvd.rank(), hvd.size()
    obj = {"rank": rank, "tensor": torch.arange(3) * rank, "text": "x" * rank}
    got = hvd.broadcast_object(obj, root_rank=size - 1)
    assert got["rank"] == size - 1 and torch.equal(got["tensor"], torch.arange(3) * (size - 1))
    gathered = hvd.allgather_object(obj)
    assert [g["rank"] for g in gathered] == list(range(size))


def test_allgather_uneven_first_dim():
    rank, size = hvd.rank(), hvd.size()
    tensor = torch.full((rank + 1, 3), rank, dtype=torch.int64)
    out = hvd.allgather(tensor)
    expected = torch.cat([torch.full((r + 1, 3), r, dtype=torch.int64) for r in range(size)])
    assert torch.equal(out, expected)


def test_barrier_and_join():
    hvd.barrier()
    last = hvd.join()
    assert isinstance(last, int) and 0 <= last < hvd.size()


def test_horovod_join_allreduce():
    """Horovod's test_horovod_join_allreduce: one rank joins at once, the others
    all-reduce two tensors (fused) with Average and then join; the joined rank's zeros
    count, Average still divides by size(), and join() returns the same rank (not the
    first to join) everywhere. Half the runs first cache the tensor names."""
    rank, size = hvd.rank(), hvd.size()
    integral = (torch.int32, torch.int64)
    for dtype, dim, first_join_rank, caching in itertools.product(
            [torch.int32, torch.int64, torch.float32, torch.float64], DIMS, [0, 1],
            [False, True]):
        gen = torch.Generator().manual_seed(1234)
        tensor_a = torch.randint(-100, 100, [5] * dim, generator=gen).to(dtype)
        tensor_b = torch.randint(-100, 100, [17] * dim, generator=gen).to(dtype)
        if caching:
            handle_a = hvd.allreduce_async(tensor_a, name="tensor_a", op=hvd.Average)
            handle_b = hvd.allreduce_async(tensor_b, name="tensor_b", op=hvd.Average)
            hvd.synchronize(handle_a)
            hvd.synchronize(handle_b)
        if rank == first_join_rank:
            ret = hvd.join()
        else:
            handle_a = hvd.allreduce_async(tensor_a, name="tensor_a", op=hvd.Average)
            handle_b = hvd.allreduce_async(tensor_b, name="tensor_b", op=hvd.Average)
            averaged_a = hvd.synchronize(handle_a)
            averaged_b = hvd.synchronize(handle_b)
            ret = hvd.join()
            for averaged, tensor in ((averaged_a, tensor_a), (averaged_b, tensor_b)):
                if dtype in integral:  # Horovod's static_cast: truncation toward zero
                    expected = torch.div(tensor * (size - 1), size, rounding_mode="trunc")
                else:
                    expected = tensor * (size - 1) / size
                assert averaged.dtype == dtype
                assert _close(averaged, expected, dtype, size), (dtype, dim, first_join_rank)
        assert ret != first_join_rank, "hvd.join() returned the rank that joined first"
        assert hvd.allgather_object(ret) == [ret] * size, \
            "hvd.join() did not return the same value on each rank"


def test_horovod_join_allgather_and_broadcast_raise():
    """Horovod's test_horovod_join_allgather / _broadcast: while a rank is joined,
    allgather and broadcast fail on the others with a RuntimeError."""
    rank = hvd.rank()
    tensor = torch.ones([17] * 3)
    if rank == 0:
        hvd.join()
        return
    with pytest.raises(RuntimeError, match="Allgather is not supported with Join"):
        hvd.allgather(tensor)
    with pytest.raises(RuntimeError, match="Broadcast is not supported with Join"):
        hvd.broadcast(tensor, 1)
    hvd.join()


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device on this host: the pinned-memory staging path "
                           "for CUDA tensors needs a GPU")
def test_allreduce_cuda():
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    for dtype in (torch.float16, torch.float32, torch.int64):
        tensor = torch.ones(1000, dtype=dtype, device=device)
        out = hvd.allreduce(tensor, op=hvd.Sum)
        assert out.device == device and torch.all(out == hvd.size())
        hvd.allreduce_(tensor, op=hvd.Sum)
        assert torch.all(tensor == hvd.size())
        assert torch.all(hvd.broadcast(tensor * hvd.rank(), 0) == 0)
