"""The "netreduce" torch.distributed backend and the DDP communication hook, on every
rank at once (started by tests/parallel/test_torch_launch.py with 2 and 3 ranks)."""
import copy
import functools
import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from netreduce.environment import discover  # noqa: E402
from tests.parallel.launched import LAUNCHED, only_when_launched_by  # noqa: E402

pytestmark = only_when_launched_by("tests/parallel/test_torch_launch.py")

if LAUNCHED:
    import netreduce.torch as nrt
    from torch.nn.parallel import DistributedDataParallel as DDP


@pytest.fixture(scope="module", autouse=True)
def process_group():
    # torchrun-style variables when the launcher exports them, else netreduce's own
    # rendezvous (rank 0 opens a TCPStore, netreduce broadcasts its address).
    init = "env://" if "MASTER_ADDR" in os.environ else "netreduce://"
    if not dist.is_initialized():
        dist.init_process_group("netreduce", init_method=init,
                                rank=discover().rank, world_size=discover().size)
    assert dist.get_backend() == "netreduce"
    yield
    dist.barrier()


def test_allreduce_ops():
    rank, size = dist.get_rank(), dist.get_world_size()
    cases = [(dist.ReduceOp.SUM, sum(range(size))), (dist.ReduceOp.AVG, sum(range(size)) / size),
             (dist.ReduceOp.MIN, 0), (dist.ReduceOp.MAX, size - 1)]
    for dtype in (torch.float32, torch.float64, torch.int64):
        for op, expected in cases:
            if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                continue
            tensor = torch.full((33,), rank, dtype=dtype)
            dist.all_reduce(tensor, op=op)
            assert torch.all(tensor == expected), (dtype, op)


def test_allreduce_product():
    """ReduceOp.PRODUCT is the aggregator's product slot op, as gloo computes it."""
    rank, size = dist.get_rank(), dist.get_world_size()
    for dtype in (torch.float32, torch.float64, torch.float16, torch.int32, torch.int64):
        tensor = torch.full((33,), rank + 2, dtype=dtype)
        dist.all_reduce(tensor, op=dist.ReduceOp.PRODUCT)
        expected = torch.prod(torch.arange(2, size + 2, dtype=torch.float64))
        assert torch.all(tensor.double() == expected), dtype


def test_async_work_and_future():
    rank, size = dist.get_rank(), dist.get_world_size()
    tensors = [torch.full((1000,), float(rank + i)) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    futures = [w.get_future() for w in works]
    for i, (t, w, f) in enumerate(zip(tensors, works, futures)):
        w.wait()
        value = f.wait()
        expected = sum(r + i for r in range(size))
        assert torch.all(t == expected) and torch.all(value[0] == expected)


def test_repeated_collectives_are_served_by_the_response_cache():
    """All-reduces and broadcasts get names from what they carry and their call count
    (so DDP's buckets, every step, skip the coordinator): more of one signature in
    flight than names to cycle through still complete in order, each with its own
    result, and the repeats hit the response cache."""
    from netreduce import api
    from netreduce.torch import process_group
    rank, size = dist.get_rank(), dist.get_world_size()
    cache = api._g.comm.cache
    hits = cache.hits
    count = 2 * process_group.RECURRING + 1
    for round_ in range(2):
        tensors = [torch.full((77,), float(rank + i)) for i in range(count)]
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        roots = [torch.full((5,), float(rank)) for _ in range(count)]
        casts = [dist.broadcast(t, src=i % size, async_op=True) for i, t in enumerate(roots)]
        for i, (t, w) in enumerate(zip(tensors, works)):
            w.wait()
            assert torch.all(t == sum(r + i for r in range(size))), (round_, i)
        for i, (t, w) in enumerate(zip(roots, casts)):
            w.wait()
            assert torch.all(t == float(i % size)), (round_, i)
    assert cache.hits > hits


def test_broadcast_and_allgather():
    rank, size = dist.get_rank(), dist.get_world_size()
    for root in range(size):
        tensor = torch.full((7, 3), float(rank))
        dist.broadcast(tensor, src=root)
        assert torch.all(tensor == root)
    outputs = [torch.empty(5, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(outputs, torch.full((5,), rank, dtype=torch.int64))
    assert [int(o[0]) for o in outputs] == list(range(size))
    flat = torch.empty(size * 4)
    dist.all_gather_into_tensor(flat, torch.full((4,), float(rank)))
    assert torch.equal(flat, torch.arange(size).repeat_interleave(4).float())


def test_async_broadcast_and_allgather():
    rank, size = dist.get_rank(), dist.get_world_size()
    tensors = [torch.full((7, 3), float(rank)) for _ in range(size)]
    bcasts = [dist.broadcast(t, src=root, async_op=True) for root, t in enumerate(tensors)]
    outputs = [torch.empty(5, dtype=torch.int64) for _ in range(size)]
    gather = dist.all_gather(outputs, torch.full((5,), rank, dtype=torch.int64),
                             async_op=True)
    flat = torch.empty(size * 4)
    gather_flat = dist.all_gather_into_tensor(flat, torch.full((4,), float(rank)),
                                              async_op=True)
    for root, (t, work) in enumerate(zip(tensors, bcasts)):
        result = work.get_future().wait()
        assert torch.all(result[0] == root) and torch.all(t == root), root
    gather.get_future().wait()
    assert [o.tolist() for o in outputs] == [[r] * 5 for r in range(size)]
    gather_flat.get_future().wait()
    assert torch.equal(flat, torch.arange(size).repeat_interleave(4).float())


def test_async_barrier_completes_when_the_last_rank_arrives():
    """Rank 0's barrier(async_op=True) returns at once and stays pending: the other
    ranks only reach theirs after an all-reduce that rank 0 starts after checking."""
    rank, size = dist.get_rank(), dist.get_world_size()
    work = None
    if rank == 0:
        work = dist.barrier(async_op=True)
        assert not work.get_future().done(), "barrier completed before the other ranks came"
    # through the Horovod API: its handles are synchronized here, not behind the barrier
    go = nrt.allreduce(torch.ones(1), op=nrt.Sum, name="barrier.go")
    assert go.item() == size
    if rank != 0:
        work = dist.barrier(async_op=True)
    work.get_future().wait()
    assert work.get_future().done()
    dist.barrier()  # the blocking form, right after: no clash with the async one


def test_object_collectives_and_barrier():
    rank, size = dist.get_rank(), dist.get_world_size()
    gathered = [None] * size
    dist.all_gather_object(gathered, {"rank": rank})
    assert [g["rank"] for g in gathered] == list(range(size))
    objs = [f"from {rank}"]
    dist.broadcast_object_list(objs, src=size - 1)
    assert objs == [f"from {size - 1}"]
    dist.barrier()


def test_reduce_scatter_collectives():
    """reduce_scatter, reduce_scatter_tensor and FSDP2's in-place all-gather (the
    input is this rank's stretch of the output), as gloo computes them."""
    rank, size = dist.get_rank(), dist.get_world_size()
    inputs = [torch.full((3,), float(rank * 10 + r)) for r in range(size)]
    out = torch.empty(3)
    dist.reduce_scatter(out, inputs)
    assert torch.equal(out, torch.full((3,), float(sum(q * 10 + rank for q in range(size)))))
    flat = torch.arange(size * 4, dtype=torch.float64) * (rank + 1)
    shard = torch.empty(4, dtype=torch.float64)
    dist.reduce_scatter_tensor(shard, flat, op=dist.ReduceOp.AVG)
    mean = sum(q + 1 for q in range(size)) / size
    assert torch.allclose(shard, torch.arange(rank * 4, rank * 4 + 4, dtype=torch.float64) * mean)
    gathered = torch.zeros(size * 2, dtype=torch.int64)
    mine = gathered.narrow(0, rank * 2, 2)
    mine.fill_(rank + 7)
    dist.all_gather_into_tensor(gathered, mine)
    assert torch.equal(gathered, torch.arange(size).repeat_interleave(2) + 7)


def test_all_to_all():
    rank, size = dist.get_rank(), dist.get_world_size()
    out = torch.empty(size * 2)
    dist.all_to_all_single(out, torch.arange(size * 2, dtype=torch.float32) + 100 * rank)
    expected = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 100 * q
                          for q in range(size)])
    assert torch.equal(out, expected)
    # uneven: rank q sends q + r + 1 elements to rank r
    sends = [q + rank + 1 for q in range(size)]
    recvs = [rank + q + 1 for q in range(size)]
    src = torch.cat([torch.full((n,), float(10 * rank + r)) for r, n in enumerate(sends)])
    out = torch.empty(sum(recvs))
    dist.all_to_all_single(out, src, output_split_sizes=recvs, input_split_sizes=sends)
    assert torch.equal(out, torch.cat([torch.full((n,), float(10 * q + rank))
                                       for q, n in enumerate(recvs)]))
    outs = [torch.empty(2) for _ in range(size)]
    dist.all_to_all(outs, [torch.full((2,), float(rank * size + r)) for r in range(size)])
    assert [o.tolist() for o in outs] == [[float(q * size + rank)] * 2 for q in range(size)]


def test_new_group_sub_groups():
    """new_group(ranks) on the netreduce backend: a process set, a sub-job at the
    aggregator; collectives see only its ranks (torch gives broadcast's src as a
    job rank and hands the backend the group rank)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    layouts = [[0, 1]] + ([[1, 2]] if size >= 3 else [[1]])
    groups = [dist.new_group(ranks) for ranks in layouts]  # every rank creates every group
    for ranks, group in zip(layouts, groups):
        if rank not in ranks:
            continue
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t, group=group)
        assert torch.equal(t, torch.full((3,), float(sum(r + 1 for r in ranks))))
        b = torch.full((2,), float(rank))
        dist.broadcast(b, src=ranks[-1], group=group)
        assert torch.equal(b, torch.full((2,), float(ranks[-1])))
        n, me = len(ranks), ranks.index(rank)
        shard = torch.empty(2)
        dist.reduce_scatter_tensor(shard, torch.arange(2 * n, dtype=torch.float32), group=group)
        assert torch.equal(shard, torch.arange(2 * me, 2 * me + 2, dtype=torch.float32) * n)
        dist.barrier(group=group)
    dist.barrier()


def test_unsupported_collectives_name_themselves():
    size = dist.get_world_size()
    with pytest.raises(NotImplementedError, match="scatter"):
        dist.scatter(torch.empty(2), [torch.ones(2)] * size if dist.get_rank() == 0 else None)
    with pytest.raises(NotImplementedError, match="BAND|reduce op"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batch(rank, step):
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(6, 8, generator=gen), torch.randn(6, 4, generator=gen)


def _reference(model, steps, size, lr):
    """Single-process SGD on the mean of every rank's gradient."""
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        for r in range(size):
            x, y = _batch(r, step)
            (torch.nn.functional.mse_loss(ref(x), y) / size).backward()
        opt.step()
    return ref


def _train(ddp, rank, steps, lr):
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        x, y = _batch(rank, step)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()


def _check(ddp, reference):
    for p, q in zip(ddp.module.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-5)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [p.detach() for p in ddp.module.parameters()])
    for other in gathered[1:]:
        assert all(torch.equal(a, b) for a, b in zip(gathered[0], other))


@pytest.mark.parametrize("overlap", ["1", "0"])
def test_ddp_on_netreduce_backend(overlap, monkeypatch):
    """Plain DDP(model) on the netreduce group: ddp_overlap's path by default (applied
    at the first forward), DDP's own bucket all-reduces with NETREDUCE_DDP_OVERLAP=0;
    either way DDP's averaged result."""
    monkeypatch.setenv("NETREDUCE_DDP_OVERLAP", overlap)
    rank, size = dist.get_rank(), dist.get_world_size()
    model = _model()
    reference = _reference(model, 4, size, 0.1)
    ddp = DDP(copy.deepcopy(model), bucket_cap_mb=0.001)  # several buckets
    with torch.no_grad():  # (an evaluation first: decided at the first training forward)
        ddp(_batch(rank, 0)[0])
    assert getattr(ddp, "_netreduce_overlap", None) is None
    _train(ddp, rank, 4, 0.1)
    _check(ddp, reference)
    state = getattr(ddp, "_netreduce_overlap", None)
    assert (state is not None) == (overlap == "1")
    if state is not None:  # every gradient went through it, none left behind
        assert len(state.views) == len(list(model.parameters())) and not state.started


def test_allreduce_hook_on_gloo_group():
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    model = _model()
    reference = _reference(model, 4, size, 0.1)
    ddp = DDP(copy.deepcopy(model), process_group=gloo, bucket_cap_mb=0.001)
    calls = []

    @functools.wraps(nrt.allreduce_hook)  # keeps the annotations DDP checks
    def counting_hook(state, bucket):
        calls.append(bucket.buffer().numel())
        return nrt.allreduce_hook(state, bucket)

    ddp.register_comm_hook("hooked", counting_hook)
    _train(ddp, rank, 4, 0.1)
    _check(ddp, reference)
    # every step's gradients went through the hook: each step's buckets together hold
    # every parameter
    numel = sum(p.numel() for p in model.parameters())
    assert len(calls) >= 4 and sum(calls) == 4 * numel, calls
    dist.destroy_process_group(gloo)


@pytest.mark.parametrize("how", ["by default", "called"])
def test_ddp_overlap_starts_each_gradient_in_backward(how):
    """netreduce.torch.ddp_overlap: a parameter's all-reduce starts as soon as backward
    has its gradient, not when DDP's bucket is whole: with one bucket for the whole
    model, the last layer's two all-reduces are under way when backward reaches the
    first layer; several buckets give DDP's result exactly. By default DDP on the
    netreduce group gets it without the call; a user's call keeps its own (label)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    model = _model()
    ddp = DDP(copy.deepcopy(model))  # default caps: one bucket for this model
    if how == "called":
        assert nrt.ddp_overlap(ddp).label == "model"
    seen = []
    def watch(module, inputs, out):  # the gradient of the first layer's output: the
        state = getattr(ddp, "_netreduce_overlap", None)      # last layer's are done
        out.register_hook(lambda g: seen.append(state and len(state.started)))
    ddp.module[0].register_forward_hook(watch)
    _train(ddp, rank, 3, 0.1)
    assert seen == [2, 2, 2], seen  # Linear(16, 4)'s weight and bias
    state = ddp._netreduce_overlap
    assert nrt.ddp_overlap(ddp) is state  # once per model, whoever applied it
    assert not state.started
    # from the third step on each .grad is its view in DDP's bucket (no copy back)
    for i, p in enumerate(ddp.module.parameters()):
        assert p.grad.data_ptr() == state.views[i].data_ptr(), i
    _check(ddp, _reference(model, 3, size, 0.1))

    several = DDP(copy.deepcopy(model), bucket_cap_mb=0.001)
    if how == "called":
        nrt.ddp_overlap(several, "several")
    _train(several, rank, 4, 0.1)
    _check(several, _reference(model, 4, size, 0.1))
    assert several._netreduce_overlap.label != state.label  # (names told apart)


@pytest.mark.parametrize("when", ["before the first forward", "after it"])
def test_a_users_comm_hook_replaces_the_default_overlap(when):
    """A comm hook the user registers on DDP over the netreduce group gets every
    bucket: registered before the first forward the overlap steps aside; after it
    (torch allows any time before backward) it takes over from the overlap."""
    rank, size = dist.get_rank(), dist.get_world_size()
    model = _model()
    reference = _reference(model, 3, size, 0.1)
    ddp = DDP(copy.deepcopy(model), bucket_cap_mb=0.001)
    calls = []

    @functools.wraps(nrt.allreduce_hook)  # keeps the annotations DDP checks
    def counting_hook(state, bucket):
        calls.append(bucket.buffer().numel())
        return nrt.allreduce_hook(state, bucket)

    if when == "before the first forward":
        ddp.register_comm_hook("mine", counting_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if step == 0 and when == "after it":
            ddp.register_comm_hook("mine", counting_hook)
        loss.backward()
        opt.step()
    _check(ddp, reference)
    numel = sum(p.numel() for p in model.parameters())
    assert sum(calls) == 3 * numel, calls
    state = getattr(ddp, "_netreduce_overlap", None)
    assert (state is None) == (when == "before the first forward")
    assert state is None or not state.started


def test_ddp_overlap_unused_parameters_and_no_sync():
    """A parameter this rank's forward did not use (DDP's find_unused_parameters)
    still meets the others' all-reduce of it, and no_sync() passes start none."""
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(5)
    trunk, heads = torch.nn.Linear(8, 8), torch.nn.ModuleList(
        [torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)])

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk, self.heads = copy.deepcopy(trunk), copy.deepcopy(heads)

        def forward(self, x, head):
            return self.heads[head](torch.relu(self.trunk(x)))

    ref = Net()
    for r in range(size):  # rank r uses head r % 2, two micro-batches per step
        for micro in range(2):
            x, y = _batch(r, micro)
            (torch.nn.functional.mse_loss(ref(x, r % 2), y) / size).backward()
    ddp = DDP(Net(), find_unused_parameters=True, bucket_cap_mb=0.0001)
    state = nrt.ddp_overlap(ddp, "unused")
    with ddp.no_sync():
        x, y = _batch(rank, 0)
        torch.nn.functional.mse_loss(ddp(x, rank % 2), y).backward()
    assert not state.started
    x, y = _batch(rank, 1)
    torch.nn.functional.mse_loss(ddp(x, rank % 2), y).backward()
    assert not state.started
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), (p.shape, p.grad, q.grad)


class _Stats(torch.nn.Module if LAUNCHED else object):
    """Buffers of every width and a 0-dim one, each forward moving them by its rank:
    what a forward sees tells whose values it got, and when."""

    def __init__(self):
        super().__init__()
        for name, dtype, shape in (("i8", torch.int8, (3,)), ("flag", torch.bool, (5,)),
                                   ("f16", torch.float16, (7,)), ("zero", torch.float64, ()),
                                   ("count", torch.int64, ())):
            self.register_buffer(name, torch.zeros(shape, dtype=dtype))
        self.seen = []

    def forward(self, x):
        self.seen.append({k: v.clone() for k, v in self.named_buffers()})
        rank = dist.get_rank()
        self.i8.add_(rank + 1)
        self.flag.fill_(rank == 0)
        self.f16.add_(rank + 0.5)
        self.zero.fill_(-0.0 if rank == 0 else 1.0)  # rank 0's sign must arrive
        self.count.add_(1)
        return x


def _buffered_model():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), _Stats(),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _broadcasts(monkeypatch):
    from netreduce.torch.process_group import ProcessGroupNetReduce
    calls = []
    original = ProcessGroupNetReduce.broadcast

    def counting(self, tensors, opts=None):
        calls.append([t.dtype for t in tensors])
        return original(self, tensors, opts)
    monkeypatch.setattr(ProcessGroupNetReduce, "broadcast", counting)
    return calls


def test_ddp_buffers_one_message_after_forward(monkeypatch):
    """DDP on the netreduce group syncs its buffers (broadcast_buffers) in one message
    per step, started after forward (DDP: one broadcast per dtype, waited before
    forward): every forward still sees rank 0's buffers as the previous forward left
    them, bit for bit, and after backward every rank holds rank 0's."""
    rank, size = dist.get_rank(), dist.get_world_size()
    ddp = DDP(_buffered_model(), bucket_cap_mb=0.001)
    stats = ddp.module[2]
    calls = _broadcasts(monkeypatch)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    steps = 4
    for step in range(steps):
        opt.zero_grad()
        x, y = _batch(rank, step)
        before = len(calls)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if step > 1:  # (forward 1: DDP's own sync, before the state exists; forward 2:
            # also DDP's bucket rebuild, whose order rank 0 broadcasts)
            assert len(calls) - before == 1 and calls[-1] == [torch.uint8], calls[before:]
        loss.backward()
        opt.step()
        # every rank holds rank 0's buffers once backward is over
        gathered = [None] * size
        dist.all_gather_object(gathered, [b.clone() for b in ddp.module.buffers()])
        for other in gathered[1:]:
            assert all(torch.equal(a, b) for a, b in zip(gathered[0], other)), step
    assert ddp._netreduce_buffers.messages == steps
    for k, seen in enumerate(stats.seen):  # rank 0's values after k forwards
        assert torch.equal(seen["i8"], torch.full((3,), k, dtype=torch.int8)), (k, seen)
        assert torch.equal(seen["f16"], torch.full((7,), 0.5 * k, dtype=torch.float16))
        assert seen["count"].item() == k and bool(seen["flag"].all()) == (k > 0)
        assert k == 0 or torch.signbit(seen["zero"]).item(), (k, seen["zero"])
    # evaluation after training: on rank 0's statistics, whatever the rank
    ddp.eval()
    with torch.no_grad():
        out = ddp(_batch(0, 99)[0])
    gathered = [None] * size
    dist.all_gather_object(gathered, out)
    assert all(torch.equal(gathered[0], o) for o in gathered[1:])
    assert ddp._netreduce_buffers.messages == steps  # (no backward after it: no sync)


@pytest.mark.parametrize("how", ["buffer hook", "broadcast_buffers=False", "overlap off"])
def test_ddp_buffers_user_choices_are_kept(how, monkeypatch):
    """A user's buffer comm hook, broadcast_buffers=False and NETREDUCE_DDP_OVERLAP=0
    keep DDP's own buffer handling."""
    from torch.nn.parallel.distributed import _BufferCommHookLocation
    rank = dist.get_rank()
    if how == "overlap off":
        monkeypatch.setenv("NETREDUCE_DDP_OVERLAP", "0")
    ddp = DDP(_buffered_model(), broadcast_buffers=how != "broadcast_buffers=False")
    hooked = []
    if how == "buffer hook":
        def mine(state, buffers):  # rank 0's, by DDP's own broadcast, counted
            hooked.append(len(buffers))
            ddp._default_broadcast_coalesced()
        ddp._register_buffer_comm_hook(None, mine, _BufferCommHookLocation.PRE_FORWARD)
    _train(ddp, rank, 3, 0.1)
    state = getattr(ddp, "_netreduce_buffers", None)
    assert state is None or state.messages == 0
    seen = ddp.module[2].seen
    if how == "broadcast_buffers=False":  # each rank's own count
        assert seen[-1]["i8"][0].item() == 2 * (rank + 1)
    else:  # rank 0's, before every forward
        assert [s["i8"][0].item() for s in seen] == [0, 1, 2]
    assert len(hooked) == (3 if how == "buffer hook" else 0)
