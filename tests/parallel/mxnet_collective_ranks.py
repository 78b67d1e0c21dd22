"""netreduce.mxnet's allgather, alltoall, reducescatter and process sets, checked on
every rank at once in MXNet's own environment.

tests/parallel/test_mxnet_collectives.py starts this file under netreduce-run with 2
and 3 ranks and the python of scripts/env_mxnet.sh's venv. Not named test_*: the
main environment (numpy 2, no mxnet) never collects it.

Rank r's data is a function of r (and of the element's position), so every rank
computes the exact expected result with numpy and compares bit for bit: a missing
rank, a wrong split or rows from the wrong rank change the result.
"""
import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

from tests.parallel.launched import LAUNCHED, initialized_by, only_when_launched_by  # noqa: E402

pytestmark = only_when_launched_by("tests/parallel/test_mxnet_collectives.py")

if LAUNCHED:
    import netreduce.mxnet as hvd
    from netreduce.errors import NegotiationError, NetReduceError

DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "int8"]
FLOATS = ["float32", "float64", "float16"]


initialized = initialized_by("netreduce.mxnet")


def _data(r, rows, tail, dtype):
    """Rank r's rows: small integers (exact in every dtype, sums of 3 ranks too)."""
    n = rows * int(np.prod(tail, dtype=np.int64))
    return ((np.arange(n) % 5) + 10 * r + 1).astype(dtype).reshape((rows,) + tuple(tail))


def _nd(array):
    return mx.nd.array(array, dtype=array.dtype)


def _horovod_rows(dim0, size, r):
    """Horovod's reducescatter split: the first dim0 % size ranks get a row more."""
    base, extra = divmod(dim0, size)
    start = r * base + min(r, extra)
    return start, base + (1 if r < extra else 0)


# --- allgather -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tail", [(), (3,), (2, 5)])
def test_allgather_exact_with_rows_differing_by_rank(dtype, tail):
    rank, size = hvd.rank(), hvd.size()
    rows = [r + 1 for r in range(size)]
    mine = _nd(_data(rank, rows[rank], tail, dtype))
    got = hvd.allgather(mine, name=f"ag.{dtype}.{len(tail)}")
    expected = np.concatenate([_data(r, rows[r], tail, dtype) for r in range(size)])
    assert got.dtype == np.dtype(dtype) and got.shape == expected.shape
    np.testing.assert_array_equal(got.asnumpy(), expected)
    np.testing.assert_array_equal(mine.asnumpy(), _data(rank, rows[rank], tail, dtype))


def test_allgather_a_rank_with_no_rows_and_many_packets():
    rank, size = hvd.rank(), hvd.size()
    rows = [0 if r == 0 else 40000 for r in range(size)]  # 160 KB a rank: several packets
    got = hvd.allgather(_nd(_data(rank, rows[rank], (1,), "float32")))
    expected = np.concatenate([_data(r, rows[r], (1,), "float32") for r in range(size)])
    np.testing.assert_array_equal(got.asnumpy(), expected)


def test_grouped_allgather_keeps_each_dtype_and_shape():
    rank, size = hvd.rank(), hvd.size()
    tensors = [_nd(_data(rank, rank + 2, (2,), "int64")), _nd(_data(rank, 1, (), "float16"))]
    got = hvd.grouped_allgather(tensors, name="gag")
    for out, (rows, tail, dtype) in zip(got, [(lambda r: r + 2, (2,), "int64"),
                                              (lambda r: 1, (), "float16")]):
        expected = np.concatenate([_data(r, rows(r), tail, dtype) for r in range(size)])
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out.asnumpy(), expected)


def test_allgather_trailing_shape_mismatch_fails_on_every_rank():
    rank = hvd.rank()
    with pytest.raises(NegotiationError):
        hvd.allgather(mx.nd.ones((2, 3 + rank)), name="ag.mismatch")


# --- alltoall ----------------------------------------------------------------------------
def _alltoall_expected(rank, size, splits_of, tail, dtype):
    """Rows rank receives: from each q, q's rows for `rank`, in rank order."""
    pieces = []
    for q in range(size):
        sp = splits_of(q)
        start = sum(sp[:rank])
        pieces.append(_data(q, sum(sp), tail, dtype)[start:start + sp[rank]])
    return np.concatenate(pieces), [splits_of(q)[rank] for q in range(size)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_alltoall_with_splits_exact(dtype):
    rank, size = hvd.rank(), hvd.size()

    def splits_of(q):  # rank q sends (q + d) % 3 rows to rank d: some zero
        return [(q + d) % 3 for d in range(size)]
    send = _nd(_data(rank, sum(splits_of(rank)), (4,), dtype))
    got, received = hvd.alltoall(send, splits=mx.nd.array(splits_of(rank), dtype="int32"),
                                 name=f"a2a.{dtype}")
    expected, counts = _alltoall_expected(rank, size, splits_of, (4,), dtype)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.asnumpy(), expected)
    assert received.dtype == np.int32 and received.asnumpy().tolist() == counts


def test_alltoall_even_split_returns_only_the_rows_and_ignores_extra_rows():
    rank, size = hvd.rank(), hvd.size()
    send = _nd(_data(rank, 2 * size, (), "float64"))
    got = hvd.alltoall(send)  # no splits: 2 rows to every rank, no splits returned
    expected, _ = _alltoall_expected(rank, size, lambda q: [2] * size, (), "float64")
    np.testing.assert_array_equal(got.asnumpy(), expected)
    # a python list of splits whose sum is below the first dimension: the rest stays
    got, received = hvd.alltoall(_nd(_data(rank, size + 5, (), "int32")), splits=[1] * size)
    expected, counts = _alltoall_expected(rank, size, lambda q: [1] * size, (), "int32")
    np.testing.assert_array_equal(got.asnumpy(), expected)
    assert received.asnumpy().tolist() == counts


def test_alltoall_bad_splits_raise_horovods_errors():
    size = hvd.size()
    x = mx.nd.ones((size + 1,))
    with pytest.raises(ValueError, match="even multiple"):
        hvd.alltoall(x)
    with pytest.raises(ValueError, match="32-bit integer"):
        hvd.alltoall(x, splits=mx.nd.ones((size,), dtype="float32"))
    with pytest.raises(ValueError, match="greater than the first dimension"):
        hvd.alltoall(x, splits=mx.nd.array([size + 2] + [0] * (size - 1), dtype="int32"))
    with pytest.raises(ValueError, match="does not equal number of workers"):
        hvd.alltoall(x, splits=[1] * (size + 1))
    # the errors are raised before anything is submitted: the job goes on
    assert hvd.allreduce(mx.nd.ones((1,)), op=hvd.Sum).asscalar() == size


def test_alltoall_dtype_mismatch_fails_on_every_rank():
    rank, size = hvd.rank(), hvd.size()
    x = mx.nd.ones((size,), dtype="int32" if rank % 2 else "float32")
    with pytest.raises(NegotiationError):
        hvd.alltoall(x, name="a2a.mismatch")


# --- reducescatter -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_reducescatter_sum_exact_with_uneven_rows(dtype):
    rank, size = hvd.rank(), hvd.size()
    dim0 = 2 * size + 1  # not a multiple of size: Horovod's split
    mine = _nd(_data(rank, dim0, (3,), dtype))
    got = hvd.reducescatter(mine, op=hvd.Sum, name=f"rs.{dtype}")
    total = sum(_data(r, dim0, (3,), dtype).astype(np.int64) for r in range(size))
    start, rows = _horovod_rows(dim0, size, rank)
    assert got.dtype == np.dtype(dtype) and got.shape == (rows, 3)
    np.testing.assert_array_equal(got.asnumpy(), total[start:start + rows].astype(dtype))
    np.testing.assert_array_equal(mine.asnumpy(), _data(rank, dim0, (3,), dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_reducescatter_average_and_scale_factors(dtype):
    rank, size = hvd.rank(), hvd.size()
    mine = _nd(_data(rank, 4 * size, (2,), dtype))
    total = sum(_data(r, 4 * size, (2,), "float64") for r in range(size))
    start, rows = _horovod_rows(4 * size, size, rank)
    got = hvd.reducescatter(mine)  # Average by default
    np.testing.assert_allclose(got.asnumpy().astype(np.float64),
                               (total / size)[start:start + rows], rtol=5e-3)
    got = hvd.reducescatter(mine, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    np.testing.assert_array_equal(got.asnumpy(), (total * 0.5)[start:start + rows].astype(dtype))


def test_reducescatter_min_max():
    rank, size = hvd.rank(), hvd.size()
    mine = _nd(_data(rank, size, (5,), "int32") * (1 if rank % 2 else -1))
    start, rows = _horovod_rows(size, size, rank)
    values = [_data(r, size, (5,), "int32") * (1 if r % 2 else -1) for r in range(size)]
    np.testing.assert_array_equal(hvd.reducescatter(mine, op=hvd.Max).asnumpy(),
                                  np.max(values, axis=0)[start:start + rows])
    np.testing.assert_array_equal(hvd.reducescatter(mine, op=hvd.Min).asnumpy(),
                                  np.min(values, axis=0)[start:start + rows])


def test_grouped_reducescatter_exact():
    rank, size = hvd.rank(), hvd.size()
    shapes = [(size + 2, (2,), "int64"), (3 * size, (), "float32")]
    tensors = [_nd(_data(rank, dim0, tail, dt)) for dim0, tail, dt in shapes]
    got = hvd.grouped_reducescatter(tensors, op=hvd.Sum, name="grs")
    for out, t in zip(got, tensors):
        dim0 = t.shape[0]
        total = sum(_data(r, dim0, t.shape[1:], "int64") for r in range(size))
        start, rows = _horovod_rows(dim0, size, rank)
        assert out.dtype == t.dtype
        np.testing.assert_array_equal(out.asnumpy(), total[start:start + rows].astype(t.dtype))


def test_reducescatter_errors():
    rank = hvd.rank()
    with pytest.raises(ValueError, match="scalar"):
        hvd.reducescatter(mx.nd.array(1.0))
    with pytest.raises(ValueError, match="scalar"):
        hvd.grouped_reducescatter([mx.nd.ones((2,)), mx.nd.array(1.0)])
    with pytest.raises(NegotiationError):
        hvd.reducescatter(mx.nd.ones((4 + rank, 3)), name="rs.mismatch")


# --- process sets ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sets():
    size = hvd.size()
    wanted = [[0], [1], [0, 1]] + ([[1, 2]] if size >= 3 else [])
    made = [hvd.add_process_set(ranks) for ranks in wanted]
    yield made
    for ps in made:
        assert hvd.remove_process_set(ps)
    hvd.barrier()


def test_process_set_identity(sets):
    rank = hvd.rank()
    for ps in sets:
        assert ps.included() == (rank in ps.ranks) and ps.size() == len(ps.ranks)
        assert ps.rank() == (ps.ranks.index(rank) if rank in ps.ranks else -1)
    assert hvd.global_process_set.size() == hvd.size() and not hvd.ccl_built()


def test_collectives_on_process_sets_see_only_their_members(sets):
    rank = hvd.rank()
    for ps in sets:
        if not ps.included():
            continue
        tag, members, me = ps.process_set_id, ps.ranks, ps.rank()
        out = hvd.allreduce(mx.nd.full((5,), rank + 1, dtype="int32"), op=hvd.Sum,
                            name=f"ps{tag}.ar", process_set=ps)
        assert out.asnumpy().tolist() == [sum(r + 1 for r in members)] * 5
        avg = hvd.grouped_allreduce([mx.nd.full((3,), float(rank))], process_set=ps)[0]
        assert np.allclose(avg.asnumpy(), sum(members) / len(members))
        root = members[-1]  # a job rank
        got = hvd.broadcast(mx.nd.full((4,), 100 + rank), root_rank=root, process_set=ps)
        assert got.asnumpy().tolist() == [100 + root] * 4
        gathered = hvd.allgather(_nd(_data(rank, rank + 1, (2,), "int64")), process_set=ps)
        np.testing.assert_array_equal(
            gathered.asnumpy(), np.concatenate([_data(r, r + 1, (2,), "int64") for r in members]))
        k = len(members)
        got, received = hvd.alltoall(_nd(_data(rank, 2 * k, (), "int32")), splits=[2] * k,
                                     process_set=ps)
        expected = np.concatenate([_data(q, 2 * k, (), "int32")[2 * me:2 * me + 2]
                                   for q in members])
        np.testing.assert_array_equal(got.asnumpy(), expected)
        assert received.asnumpy().tolist() == [2] * k
        shard = hvd.reducescatter(_nd(_data(rank, 2 * k + 1, (), "int64")), op=hvd.Sum,
                                  process_set=ps)
        total = sum(_data(r, 2 * k + 1, (), "int64") for r in members)
        start, rows = _horovod_rows(2 * k + 1, k, me)
        np.testing.assert_array_equal(shard.asnumpy(), total[start:start + rows])
        grouped = hvd.grouped_reducescatter([_nd(_data(rank, k, (), "float64"))], op=hvd.Sum,
                                            process_set=ps)[0]
        np.testing.assert_array_equal(
            grouped.asnumpy(), sum(_data(r, k, (), "float64") for r in members)[me:me + 1])
        assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=ps) == \
            {"from": root}
        assert hvd.allgather_object(rank, process_set=ps) == members
        hvd.barrier(process_set=ps)
    hvd.barrier()


def test_non_member_and_bad_arguments_are_refused(sets):
    rank = hvd.rank()
    outside = next(ps for ps in sets if not ps.included())
    with pytest.raises(NetReduceError, match="not a member"):
        hvd.allgather(mx.nd.ones((1,)), process_set=outside)
    inside = next(ps for ps in sets if ps.included())
    not_in_set = next(r for r in range(hvd.size()) if r not in inside.ranks)
    with pytest.raises(ValueError, match="not in"):
        hvd.broadcast(mx.nd.ones((1,)), root_rank=not_in_set, process_set=inside)
    with pytest.raises(ValueError, match="must be a ProcessSet"):
        hvd.allreduce(mx.nd.ones((1,)), process_set=[0, 1])
    assert rank >= 0


def test_distributed_optimizer_and_trainer_on_a_process_set(sets):
    """Members average over the set; a rank outside it steps on its own gradient."""
    rank, size = hvd.rank(), hvd.size()
    pair = next(ps for ps in sets if ps.ranks == [0, 1])
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=1.0), process_set=pair)
    w = mx.nd.zeros((6,))
    opt.update(0, w, mx.nd.full((6,), float(rank + 1)), opt.create_state(0, w))
    own = -(rank + 1.0)
    assert np.allclose(w.asnumpy(), -1.5 if rank in pair.ranks else own), w.asnumpy()

    net = mx.gluon.nn.Dense(2, in_units=3, use_bias=False)
    net.initialize(mx.init.Zero())
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 1.0},
                                     process_set=pair, prefix="pair")
    with mx.autograd.record():
        loss = (net(mx.nd.full((1, 3), float(rank + 1)))).sum()
    loss.backward()
    trainer.step(1)
    weight = net.weight.data().asnumpy()
    assert np.allclose(weight, -1.5 if rank in pair.ranks else own), weight
    hvd.barrier()
    assert size >= 2
