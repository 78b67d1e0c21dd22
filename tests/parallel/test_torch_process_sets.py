"""Process sets, checked the way Horovod 0.28's test/parallel/test_torch.py checks
them (test_horovod_*_process_sets): sets {0}, {1}, {0, 1} and, with 3 ranks, the
overlapping {0, 1} and {1, 2}; every collective on a set sees only its members,
broadcast roots are job ranks, a non-member is refused.

Run on every rank at once by tests/parallel/test_torch_launch.py (2 and 3 ranks).
"""
import pytest

torch = pytest.importorskip("torch")

from tests.parallel.launched import LAUNCHED, only_when_launched_by  # noqa: E402

pytestmark = only_when_launched_by("tests/parallel/test_torch_launch.py")

if LAUNCHED:
    import netreduce.torch as hvd


@pytest.fixture(scope="module")
def sets():
    hvd.init()
    size = hvd.size()
    wanted = [[0], [1], [0, 1]] + ([[1, 2]] if size >= 3 else [])
    made = [hvd.add_process_set(ranks) for ranks in wanted]
    yield made
    for ps in made:
        assert hvd.remove_process_set(ps)
    hvd.barrier()


def _members(ps):
    return ps.ranks


def test_process_set_identity(sets):
    rank = hvd.rank()
    for ps in sets:
        assert ps.included() == (rank in ps.ranks)
        assert ps.size() == len(ps.ranks)
        assert ps.rank() == (ps.ranks.index(rank) if rank in ps.ranks else -1)
    assert hvd.global_process_set.size() == hvd.size()
    assert len({ps.process_set_id for ps in sets}) == len(sets)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.float64])
def test_allreduce_process_sets(sets, dtype):
    rank = hvd.rank()
    for ps in sets:
        if not ps.included():
            continue
        out = hvd.allreduce(torch.full((5,), rank + 1).to(dtype), op=hvd.Sum,
                            process_set=ps, name=f"ps.ar.{ps.process_set_id}.{dtype}")
        assert torch.equal(out, torch.full((5,), sum(r + 1 for r in ps.ranks)).to(dtype))
        avg = hvd.allreduce(torch.full((3,), float(rank)), process_set=ps)
        assert torch.allclose(avg, torch.full((3,), sum(ps.ranks) / len(ps.ranks)))
    hvd.barrier()


def test_grouped_allreduce_async_process_sets(sets):
    rank = hvd.rank()
    for ps in sets:
        if ps.included():
            h = hvd.grouped_allreduce_async([torch.ones(2) * rank, torch.ones(3)], op=hvd.Sum,
                                            process_set=ps)
            a, b = hvd.synchronize(h)
            assert torch.equal(a, torch.ones(2) * sum(ps.ranks))
            assert torch.equal(b, torch.ones(3) * len(ps.ranks))


def test_broadcast_process_sets(sets):
    """The root is named by its rank in the job, as in Horovod."""
    rank = hvd.rank()
    for ps in sets:
        if not ps.included():
            continue
        for root in ps.ranks:
            out = hvd.broadcast(torch.full((4,), float(rank)), root_rank=root, process_set=ps)
            assert torch.equal(out, torch.full((4,), float(root)))
        assert hvd.broadcast_object({"from": rank}, root_rank=ps.ranks[-1],
                                    process_set=ps) == {"from": ps.ranks[-1]}


def test_allgather_reducescatter_alltoall_process_sets(sets):
    rank = hvd.rank()
    for ps in sets:
        if not ps.included():
            continue
        got = hvd.allgather(torch.full((rank + 1, 2), rank), process_set=ps)
        assert torch.equal(got, torch.cat([torch.full((r + 1, 2), r) for r in ps.ranks]))
        n = len(ps.ranks)
        shard = hvd.reducescatter(torch.arange(2 * n, dtype=torch.float32) * (rank + 1),
                                  op=hvd.Sum, process_set=ps)
        total = torch.arange(2 * n, dtype=torch.float32) * sum(r + 1 for r in ps.ranks)
        me = ps.rank()
        assert torch.equal(shard, total[2 * me:2 * me + 2])
        out = hvd.alltoall(torch.arange(n, dtype=torch.float32) + 10 * rank, process_set=ps)
        assert torch.equal(out, torch.tensor([10.0 * r + me for r in ps.ranks]))
        hvd.barrier(process_set=ps)


def test_allreduce_grad_process_set(sets):
    rank = hvd.rank()
    for ps in sets:
        if not ps.included():
            continue
        x = torch.ones(3, requires_grad=True)
        (hvd.allreduce(x, op=hvd.Sum, process_set=ps) * (rank + 1)).sum().backward()
        assert torch.equal(x.grad, torch.full((3,), float(sum(r + 1 for r in ps.ranks))))


def test_non_member_is_refused(sets):
    rank = hvd.rank()
    outsider = next((ps for ps in sets if not ps.included()), None)
    if outsider is None:
        pytest.skip("this rank belongs to every set")
    with pytest.raises(RuntimeError, match="not a member"):
        hvd.allreduce(torch.ones(1), process_set=outsider)
    assert rank not in outsider.ranks


def test_distributed_optimizer_process_set(sets):
    """Members average over the set; a rank outside it registers no hooks and steps on
    its own gradient (Horovod's), instead of failing in backward as a non-member."""
    rank = hvd.rank()
    for ps in sets[1:]:  # {1}: rank 0 is outside; {0, 1}; {1, 2}: rank 0 outside
        model = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(1.0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                       named_parameters=model.named_parameters(),
                                       process_set=ps)
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
        opt.step()
        grad = sum(r + 1 for r in ps.ranks) / len(ps.ranks) if ps.included() else rank + 1
        assert torch.allclose(model.weight.detach(), torch.full((1, 2), 1.0 - grad)), \
            (ps, model.weight)
    hvd.barrier()
