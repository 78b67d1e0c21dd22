"""netreduce.torch in one process (size 1, embedded aggregator): registration, argument
checking and the size-1 behaviour of every entry point. The multi-rank behaviour is in
test_torch.py, test_torch_optimizer.py and test_torch_distributed.py."""
import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from netreduce.environment import discover  # noqa: E402
from tests.peers import require_horovod_torch  # noqa: E402

pytestmark = pytest.mark.skipif(discover().size > 1,
                                reason="single-process tests; skipped under a launcher")


@pytest.fixture(scope="module")
def hvd():
    import netreduce.torch as hvd
    hvd.init()
    yield hvd
    hvd.shutdown()


def test_import_registers_backend():
    import netreduce.torch  # noqa: F401
    assert "netreduce" in dist.Backend.backend_list
    assert dist.Backend("netreduce") == "netreduce"


def test_argument_errors_need_no_communication():
    import netreduce.torch as hvd
    with pytest.raises(ValueError, match="unsupported dtype complex64"):
        hvd.allreduce_async(torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(ValueError, match="not contiguous"):
        hvd.allreduce_async_(torch.zeros(3, 3).t(), name="w")
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce_async(torch.zeros(3), average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match="bool"):
        hvd.allreduce_async(torch.zeros(3, dtype=torch.bool))


def test_compression_roundtrip():
    import netreduce.torch as hvd
    t = torch.linspace(-1, 1, 11, dtype=torch.float64)
    c, ctx = hvd.Compression.fp16.compress(t)
    assert c.dtype == torch.float16
    assert hvd.Compression.fp16.decompress(c, ctx).dtype == torch.float64
    i = torch.arange(4)
    c, ctx = hvd.Compression.fp16.compress(i)
    assert c is i and hvd.Compression.fp16.decompress(c, ctx) is i


def test_size_one_collectives(hvd):
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    t = torch.arange(10, dtype=torch.float32)
    assert torch.equal(hvd.allreduce(t, op=hvd.Sum), t)
    assert torch.equal(hvd.allreduce(t, postscale_factor=2.0), t * 2)
    assert torch.equal(hvd.broadcast(t, 0), t)
    assert torch.equal(hvd.allgather(t), t)
    assert hvd.broadcast_object({"a": 1}) == {"a": 1}
    assert hvd.allgather_object(3) == [3]
    assert hvd.join() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hvd.barrier()


def test_distributed_optimizer_is_the_wrapped_class(hvd):
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                   named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.Adam) and type(opt).__name__ == "Adam"
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, 0)
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)  # Horovod's signature
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        hvd.broadcast_optimizer_state(opt, 0, model="not a model")
    hvd.broadcast_parameters(model.state_dict(), 0)


@pytest.mark.parametrize("op", ["Adasum", 2])
def test_distributed_optimizer_refuses_unsupported_op_at_construction(hvd, op):
    """Not inside the first backward's gradient hook, where Horovod code would meet it."""
    model = torch.nn.Linear(3, 2)
    op = getattr(hvd, op) if isinstance(op, str) else op
    with pytest.raises(NotImplementedError,
                       match=r"DistributedOptimizer\(op=.*Adasum is not supported"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), op=op)


def test_distributed_optimizer_takes_horovod_integer_ops(hvd):
    model = torch.nn.Linear(3, 2)
    # op=0 is Horovod's Average, the one op gradient_predivide_factor allows
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=0,
                                   gradient_predivide_factor=2.0)
    assert opt.op is hvd.Average
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), op=1,
                                 gradient_predivide_factor=2.0)


def test_signatures_match_horovod():
    """Every function both packages export takes Horovod's parameters, in Horovod's
    order with Horovod's simple defaults (netreduce may append more)."""
    horovod = require_horovod_torch()  # fails under CI when Horovod is missing
    import netreduce.torch as hvd
    from netreduce.ops import as_op
    checked = []
    for name in sorted(n for n in dir(hvd) if not n.startswith("_")):
        theirs, ours = getattr(horovod, name, None), getattr(hvd, name)
        if not (inspect.isfunction(theirs) and inspect.isfunction(ours)):
            continue
        their_params = list(inspect.signature(theirs).parameters.values())
        our_params = list(inspect.signature(ours).parameters.values())
        if [p.kind for p in their_params] == [inspect.Parameter.VAR_POSITIONAL,
                                              inspect.Parameter.VAR_KEYWORD]:
            continue  # a C-library forwarder (init, shutdown): nothing to compare
        assert [p.name for p in our_params[:len(their_params)]] == \
            [p.name for p in their_params], name
        for a, b in zip(their_params, our_params):
            if a.default is inspect.Parameter.empty:
                assert b.default is inspect.Parameter.empty, (name, a.name)
            elif a.name == "op" and a.default is not None:
                assert as_op(a.default) is as_op(b.default), (name, a.name)
            elif a.default is None or isinstance(a.default, (bool, int, float, str)):
                assert a.default == b.default, (name, a.name)
        checked.append(name)
    assert {"broadcast_optimizer_state", "DistributedOptimizer", "allreduce"} <= set(checked)


def test_process_group_of_one(hvd):
    dist.init_process_group("netreduce", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert dist.get_backend() == "netreduce"
        t = torch.ones(4)
        dist.all_reduce(t)
        assert torch.equal(t, torch.ones(4))
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
        assert torch.equal(work.get_future().wait()[0], torch.ones(4))
        with pytest.raises(NotImplementedError, match="gather"):
            dist.gather(t, [torch.empty(4)], dst=0)
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
        ddp(torch.ones(2, 3)).sum().backward()
        assert ddp.module.weight.grad is not None
    finally:
        dist.destroy_process_group()
