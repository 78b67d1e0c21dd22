"""netreduce.torch's allgather family, checked the way Horovod 0.28's
test/parallel/test_torch.py checks horovod.torch's (test_horovod_allgather*):
every dtype and dims 1-3, first dimensions that differ by rank, async submissions
that are really asynchronous, grouped calls, autograd, and errors.

Run on every rank at once by tests/parallel/test_torch_launch.py (2 and 3 ranks).
The allgather-vs-barrier case (which used to hang) is test_collective_mismatch_*:
it starts its own job, because the error stops that job.
"""
import itertools
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from netreduce.environment import discover  # noqa: E402
from tests.parallel.launched import LAUNCHED, initialized_by, only_when_launched_by  # noqa: E402

launched = only_when_launched_by("tests/parallel/test_torch_launch.py")

if LAUNCHED:
    import netreduce.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.float32,
          torch.float64, torch.bfloat16, torch.bool]
DIMS = [1, 2, 3]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


initialized = initialized_by("netreduce.torch", autouse=False)


def _mine(rank, dim, dtype):
    rows = rank + 1
    t = torch.full([rows] + [4] * (dim - 1), rank, dtype=torch.int64)
    t += torch.arange(rows).reshape([rows] + [1] * (dim - 1))
    return t.to(dtype) if dtype != torch.bool else (t % 2).bool()


@launched
@pytest.mark.parametrize("dtype,dim", list(itertools.product(DTYPES, DIMS)))
def test_allgather_variable_size(initialized, dtype, dim):
    rank, size = hvd.rank(), hvd.size()
    out = hvd.allgather(_mine(rank, dim, dtype), name=f"ag.{dtype}.{dim}")
    expected = torch.cat([_mine(r, dim, dtype) for r in range(size)])
    assert out.dtype == dtype and torch.equal(out, expected)


@launched
def test_allgather_async_is_asynchronous(initialized):
    """allgather_async returns a handle at once, even though the other ranks submit
    only after a barrier that this rank enters after polling."""
    rank, size = hvd.rank(), hvd.size()
    if rank == 0:
        h = hvd.allgather_async(torch.ones(2, 3), name="ag.async")
        assert hvd.poll(h) is False
        hvd.barrier()
    else:
        hvd.barrier()
        h = hvd.allgather_async(torch.ones(2, 3), name="ag.async")
    assert torch.equal(hvd.synchronize(h), torch.ones(2 * size, 3))


@launched
def test_allgather_async_fused(initialized):
    rank, size = hvd.rank(), hvd.size()
    handles = [(hvd.allgather_async(_mine(rank, dim, dtype), name=f"ag.fused.{dtype}.{dim}"),
                dtype, dim) for dtype, dim in itertools.product(DTYPES, DIMS)]
    for h, dtype, dim in handles:
        assert torch.equal(hvd.synchronize(h),
                           torch.cat([_mine(r, dim, dtype) for r in range(size)]))


@launched
def test_grouped_allgather(initialized):
    rank, size = hvd.rank(), hvd.size()
    outs = hvd.grouped_allgather([_mine(rank, 1, torch.float32), _mine(rank, 3, torch.int32)],
                                 name="ag.grouped")
    assert torch.equal(outs[0], torch.cat([_mine(r, 1, torch.float32) for r in range(size)]))
    assert torch.equal(outs[1], torch.cat([_mine(r, 3, torch.int32) for r in range(size)]))


@launched
def test_allgather_grad(initialized):
    """Horovod's gradient: this rank's rows of the averaged gradient (Horovod
    0.28.1-gloo gives rank 0 [[0, 0]] and rank 1 [[1, 1], [2, 2]] here)."""
    rank, size = hvd.rank(), hvd.size()
    x = torch.ones(rank + 1, 2, requires_grad=True)
    y = hvd.allgather(x, name="ag.grad")
    (y * torch.arange(y.shape[0]).unsqueeze(1)).sum().backward()
    offset = sum(r + 1 for r in range(rank))
    expected = torch.arange(offset, offset + rank + 1, dtype=torch.float32).unsqueeze(1)
    assert torch.equal(x.grad, expected.expand(rank + 1, 2))


@launched
def test_grouped_allgather_grad(initialized):
    rank, size = hvd.rank(), hvd.size()
    xs = [torch.ones(rank + 1, requires_grad=True), torch.ones(2, 2, requires_grad=True)]
    ys = hvd.grouped_allgather(xs, name="ag.ggrad")
    (ys[0] * (rank + 1)).sum().backward(retain_graph=True)
    # the averaged gradient of ys[0] is mean(r + 1) everywhere
    assert torch.allclose(xs[0].grad, torch.full((rank + 1,), (size + 1) / 2))


@launched
def test_allgather_shape_mismatch_error(initialized):
    rank = hvd.rank()
    with pytest.raises(RuntimeError, match="Mismatched allgather tensor shapes"):
        hvd.allgather(torch.ones(2, 2 + rank), name="ag.bad.shape")


@launched
def test_allgather_dtype_mismatch_error(initialized):
    dtype = torch.float32 if hvd.rank() == 0 else torch.int32
    with pytest.raises(RuntimeError, match="Mismatched data types"):
        hvd.allgather(torch.ones(3, dtype=dtype), name="ag.bad.dtype")


@launched
def test_allgather_duplicate_name_error(initialized):
    h = hvd.allgather_async(torch.ones(2), name="ag.dup")
    with pytest.raises(ValueError, match="already being reduced"):
        hvd.allgather_async(torch.ones(2), name="ag.dup")
    hvd.synchronize(h)


# --- a collective only some ranks call must fail, never hang ---------------------------
_MISMATCH = """
import sys, torch, netreduce.torch as hvd
hvd.init()
try:
    if hvd.rank() == 0:
        hvd.synchronize(hvd.allgather_async(torch.ones(3), name="lonely.gather"))
    else:
        hvd.barrier()
except hvd.HorovodInternalError as exc:
    print(f"ERROR rank {hvd.rank()}: {exc}", flush=True)
    sys.exit(0)
print(f"NO ERROR rank {hvd.rank()}", flush=True)
sys.exit(1)
"""


@pytest.mark.skipif(discover().size > 1, reason="starts its own job")
@pytest.mark.parametrize("ranks", [2, 3])
def test_collective_mismatch_errors_within_timeout(ranks):
    """Rank 0 all-gathers while the others wait in barrier(): every rank fails
    (after NETREDUCE_TIMEOUT, set short here) with an error naming the tensor it
    waited for, or the other side's, and the ranks that did not submit it."""
    env = dict(os.environ, NETREDUCE_TIMEOUT="3", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-m", "netreduce.launcher", "-np", str(ranks), "--",
                           sys.executable, "-c", _MISMATCH], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)
    lines = [ln for ln in proc.stdout.splitlines() if "ERROR rank" in ln]
    assert len(lines) == ranks and not any("NO ERROR" in ln for ln in lines), proc.stdout[-4000:]
    others = ", ".join(map(str, range(1, ranks)))
    for line in lines:
        named = ("'lonely.gather'" in line and f"not submitted by rank{'s' if ranks > 2 else ''}"
                 f" {others} " in line) or ("'__barrier__'" in line and "by rank 0 " in line)
        assert named and "NETREDUCE_TIMEOUT=3 s" in line, line


# --- sparse gradients (Horovod all-gathers indices and values) ---------------------------
@launched
def test_sparse_allreduce_async(initialized):
    rank, size = hvd.rank(), hvd.size()
    dense = torch.zeros(6, 3)
    dense[rank % 6] = rank + 1.0
    dense[(rank + 2) % 6, 1] = 10.0
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse.t", op=hvd.Sum)
    got = handle()
    assert got.is_sparse
    expected = torch.zeros(6, 3)
    for r in range(size):
        expected[r % 6] += r + 1.0
        expected[(r + 2) % 6, 1] += 10.0
    assert torch.equal(got.to_dense(), expected)
    avg = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse.avg", op=hvd.Average)()
    assert torch.allclose(avg.to_dense(), expected / size)


@launched
@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_distributed_optimizer_sparse_embedding(initialized, sparse_as_dense):
    """nn.Embedding(sparse=True): each rank looks up different rows; after step()
    every rank holds the same weights, those of the averaged dense gradient."""
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(5)
    emb = torch.nn.Embedding(10, 4, sparse=True)
    reference = emb.weight.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    emb(torch.tensor([rank, rank + 1])).sum().backward()
    opt.step()
    grad = torch.zeros(10, 4)
    for r in range(size):
        grad[r] += 1.0
        grad[r + 1] += 1.0
    assert torch.allclose(emb.weight.detach(), reference - grad / size)


@launched
@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_reach_sparse_adam_sparse(initialized, sparse_as_dense):
    """torch.optim.SparseAdam takes only sparse gradients: with either setting the
    averaged gradient reaches it sparse, and the step is the one a single SparseAdam
    makes with the averaged gradient (also after broadcast_optimizer_state, whose
    materialising step needs sparse zero gradients for it)."""
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(7)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    reference = torch.nn.Embedding(10, 3, sparse=True)
    reference.load_state_dict(emb.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=emb)
    assert emb.weight.grad.is_sparse
    opt.zero_grad()
    emb(torch.tensor([rank, rank + 2, 9])).sum().backward()
    opt.step()
    assert emb.weight.grad.is_sparse
    grad = torch.zeros(10, 3)
    for r in range(size):
        grad[[r, r + 2, 9]] += 1.0
    ref_opt = torch.optim.SparseAdam(list(reference.parameters()), lr=0.1)
    for g in (torch.zeros(10, 3), grad / size):  # the materialising step, then the real one
        reference.weight.grad = g.to_sparse()
        ref_opt.step()
    assert torch.allclose(emb.weight.detach(), reference.weight.detach(), atol=1e-6)


# --- alltoall (relayed through the aggregator as all-gathers) -----------------------------
@launched
@pytest.mark.parametrize("dtype,dim", list(itertools.product(
    [torch.int32, torch.int64, torch.float16, torch.float32, torch.float64], DIMS)))
def test_alltoall_equal_splits(initialized, dtype, dim):
    rank, size = hvd.rank(), hvd.size()
    x = (torch.arange(2 * size).reshape([2 * size] + [1] * (dim - 1)) + 100 * rank).to(dtype)
    x = x.expand([2 * size] + [3] * (dim - 1)).contiguous()
    out = hvd.alltoall(x, name=f"a2a.{dtype}.{dim}")
    expected = torch.cat([(torch.arange(2 * rank, 2 * rank + 2).reshape([2] + [1] * (dim - 1))
                           + 100 * q).to(dtype).expand([2] + [3] * (dim - 1)) for q in range(size)])
    assert torch.equal(out, expected)


@launched
def test_alltoall_splits_and_received_splits(initialized):
    """Rank q sends q + r + 1 rows to rank r (Horovod 0.28.1-gloo with 2 ranks and
    splits [1, 5] / [4, 2] gives rank 0 [0, 10, 11, 12, 13] with received [1, 4])."""
    rank, size = hvd.rank(), hvd.size()
    splits = torch.tensor([rank + r + 1 for r in range(size)], dtype=torch.int32)
    x = torch.arange(int(splits.sum()) + 2, dtype=torch.float32) + 100 * rank  # 2 rows unsent
    out, received = hvd.alltoall(x, splits=splits, name="a2a.splits")
    assert received.dtype == torch.int32
    assert received.tolist() == [q + rank + 1 for q in range(size)]
    expected = torch.cat([torch.arange(sum(q + r + 1 for r in range(rank)),
                                       sum(q + r + 1 for r in range(rank + 1)),
                                       dtype=torch.float32) + 100 * q for q in range(size)])
    assert torch.equal(out, expected)
    h = hvd.alltoall_async(x, splits=splits.tolist(), name="a2a.async")
    out2, received2 = hvd.synchronize(h)
    assert torch.equal(out2, expected) and torch.equal(received2, received)


@launched
def test_alltoall_grad(initialized):
    """The gradient goes back along the received splits (Horovod 0.28.1-gloo, splits
    [1, 3] / [2, 2]: rank 0's gradient [1, 2, 2, 2], rank 1's [1, 1, 2, 2])."""
    rank, size = hvd.rank(), hvd.size()
    splits = torch.tensor([1 + (r + rank) % 2 for r in range(size)], dtype=torch.int32)
    x = torch.ones(int(splits.sum()), 2, requires_grad=True)
    out, _ = hvd.alltoall(x, splits=splits, name="a2a.grad")
    (out * (rank + 1)).sum().backward()
    expected = torch.cat([torch.full((int(s),), float(r + 1)) for r, s in enumerate(splits)])
    assert torch.equal(x.grad[:, 0], expected)


@launched
@pytest.mark.parametrize("bad,match", [
    ("length", "Number of entries in splits does not equal number of workers."),
    ("sum", "Sum of splits entries is greater than the first dimension of tensor."),
    ("type", "alltoall expects splits to contain 32-bit integer elements."),
    ("even", "splits not provided, but first dimension of tensor is not an even multiple"),
])
def test_alltoall_errors(initialized, bad, match):
    size = hvd.size()
    x = torch.ones(2 * size)
    with pytest.raises(ValueError, match=match):
        if bad == "length":
            hvd.alltoall(x, splits=torch.ones(size + 1, dtype=torch.int32))
        elif bad == "sum":
            hvd.alltoall(x, splits=torch.full((size,), 3, dtype=torch.int32))
        elif bad == "type":
            hvd.alltoall(x, splits=torch.ones(size, dtype=torch.float32))
        else:
            hvd.alltoall(torch.ones(2 * size + 1))
