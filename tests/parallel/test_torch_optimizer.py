"""DistributedOptimizer, broadcast_parameters and broadcast_optimizer_state, on every
rank at once (started by tests/parallel/test_torch_launch.py with 2 and 3 ranks)."""
import copy

import pytest

torch = pytest.importorskip("torch")

from tests.parallel.launched import LAUNCHED, only_when_launched_by  # noqa: E402

pytestmark = only_when_launched_by("tests/parallel/test_torch_launch.py")

if LAUNCHED:
    import netreduce.torch as hvd


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()
    yield
    hvd.barrier()


def _model():
    torch.manual_seed(42)  # same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def _batch(rank, step=0):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)


def _loss(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def _reference_grads(model, batches):
    """The gradient DistributedOptimizer must produce: the mean of each rank's
    (locally summed over ``batches[rank]``) gradient."""
    ref = copy.deepcopy(model)
    ref.zero_grad()
    for rank_batches in batches:
        for batch in rank_batches:
            _loss(ref, batch).backward()
    return [p.grad / len(batches) for p in ref.parameters()]


def _same_on_all_ranks(tensors):
    gathered = hvd.allgather_object([t.detach().clone() for t in tensors])
    for other in gathered[1:]:
        for a, b in zip(gathered[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_distributed_optimizer_averages_gradients(compression):
    rank, size = hvd.rank(), hvd.size()
    model = _model()
    expected = _reference_grads(model, [[_batch(r)] for r in range(size)])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=getattr(hvd.Compression, compression))
    assert isinstance(opt, torch.optim.SGD)
    opt.zero_grad()
    _loss(model, _batch(rank)).backward()
    opt.synchronize()
    tol = 1e-3 if compression == "fp16" else 1e-6
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, e, atol=tol), compression
    with opt.skip_synchronize():
        opt.step()
    _same_on_all_ranks(list(model.parameters()))


def test_distributed_optimizer_trains_identically():
    rank = hvd.rank()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    size = hvd.size()

    def objective():
        """What the job minimises: the loss over every rank's batches (computable on
        each rank, since batches are seeded by rank and step)."""
        with torch.no_grad():
            return sum(_loss(model, _batch(r, s)).item()
                       for r in range(size) for s in (0, 1)) / (2 * size)
    first = objective()
    for step in range(8):
        opt.zero_grad()
        loss = _loss(model, _batch(rank, step % 2))
        loss.backward()
        opt.step()
    _same_on_all_ranks(list(model.parameters()))
    last = objective()
    assert last < first, (first, last)


def test_backward_passes_per_step():
    rank, size = hvd.rank(), hvd.size()
    model = _model()
    passes = 3
    batches = [[_batch(r, s) for s in range(passes)] for r in range(size)]
    expected = _reference_grads(model, batches)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes)
    opt.zero_grad()
    for s in range(passes):
        _loss(model, batches[rank][s]).backward()
    opt.step()
    # step() consumed the accumulated gradients: check them, then one pass too many
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, e, atol=1e-6)
    opt.zero_grad()
    for s in range(passes):
        _loss(model, batches[rank][s]).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        _loss(model, batches[rank][0]).backward()
    opt.synchronize()  # complete the outstanding all-reduces on every rank


def test_gradient_predivide_factor():
    rank, size = hvd.rank(), hvd.size()
    model = _model()
    expected = _reference_grads(model, [[_batch(r)] for r in range(size)])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   gradient_predivide_factor=float(size))
    _loss(model, _batch(rank)).backward()
    opt.synchronize()
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, e, atol=1e-6)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 op=hvd.Sum, gradient_predivide_factor=2.0)


def test_named_parameters_validation():
    model = _model()
    params = list(model.named_parameters())
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("same", p) for _, p in params])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=params[:1])


def test_unused_parameter_still_reduced():
    """A parameter that one rank's forward skips gets zeros from that rank."""
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    params = [("a." + n, p) for n, p in a.named_parameters()] + \
             [("b." + n, p) for n, p in b.named_parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1),
                                   named_parameters=params)
    x = torch.ones(2, 3)
    out = a(x).sum() + (b(x).sum() if rank == 0 else 0)
    out.backward()
    opt.synchronize()
    assert torch.allclose(b.weight.grad, torch.full((1, 3), 2.0 / size))


def test_broadcast_parameters_and_optimizer_state():
    rank = hvd.rank()
    torch.manual_seed(rank)  # different weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5),
                                torch.nn.Linear(5, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.001 * (rank + 1),
                           betas=(0.9, 0.99 - rank / 100))
    if rank != 0:
        # rank 0 keeps a fresh optimizer (no state), the others have taken steps
        for step in range(rank):
            opt.zero_grad()
            _loss(model, _batch(rank, step)).backward()
            opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)
    torch.manual_seed(0)
    expected = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5),
                                   torch.nn.Linear(5, 2))
    for name, value in model.state_dict().items():
        assert torch.equal(value, expected.state_dict()[name]), name
    assert opt.param_groups[0]["lr"] == 0.001
    assert opt.param_groups[0]["betas"] == (0.9, 0.99)
    state = [v for p in model.parameters() for v in opt.state[p].values()]
    _same_on_all_ranks(state)
    assert all(torch.count_nonzero(v) == 0 for p in model.parameters()
               for k, v in opt.state[p].items() if k != "step")


def test_broadcast_parameters_named_list():
    rank = hvd.rank()
    torch.manual_seed(rank)
    model = _model()
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=hvd.size() - 1)
    _same_on_all_ranks(list(model.parameters()))


def test_broadcast_optimizer_state_with_parameters_that_take_no_gradient():
    """A fresh optimizer over a frozen parameter and a trained one: the state is made
    (one step on zero gradients), broadcast, and the parameters are unchanged; the
    frozen one has no gradient, the other keeps a zero one (Horovod's; code written
    for Horovod broadcasts it); a gradient a parameter already had is kept."""
    rank = hvd.rank()
    frozen = torch.nn.Parameter(torch.tensor([1.0, 3.0]), requires_grad=False)
    trained = torch.nn.Parameter(torch.full((4,), 2.0 + rank))
    kept = torch.nn.Parameter(torch.ones(3))
    kept.grad = torch.full((3,), 5.0 + rank)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([frozen, trained, kept], lr=0.1, momentum=0.9, weight_decay=0.5),
        named_parameters=[("frozen", frozen), ("trained", trained), ("kept", kept)])
    hvd.broadcast_parameters([("trained", trained)], root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert frozen.grad is None and frozen.tolist() == [1.0, 3.0]
    assert torch.equal(trained.grad, torch.zeros(4))
    assert torch.equal(hvd.broadcast(trained.grad, root_rank=0), torch.zeros(4))
    assert torch.equal(trained.detach(), torch.full((4,), 2.0))  # weight decay undone
    assert torch.equal(kept.grad, torch.full((3,), 5.0 + rank))
    assert frozen not in opt.state
    _same_on_all_ranks([opt.state[trained]["momentum_buffer"]])
