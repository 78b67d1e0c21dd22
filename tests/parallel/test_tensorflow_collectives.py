"""netreduce.tensorflow's allgather, alltoall and reducescatter families, process sets
and error types, eagerly and inside tf.function (the asynchronous graph op), with
the gradients Horovod defines. Rank r contributes values derived from r; every
result is checked exactly against a numpy reference of all ranks' inputs.

Started on every rank by tests/parallel/test_tensorflow_launch.py (2 and 3 ranks).
"""
import numpy as np
import pytest

from tests.parallel.launched import LAUNCHED, initialized_by, only_when_launched_by, skip_module_unless_launched

pytestmark = only_when_launched_by("tests/parallel/test_tensorflow_launch.py")
skip_module_unless_launched(pytestmark)  # before TensorFlow's import

tf = pytest.importorskip("tensorflow")

if LAUNCHED:
    import netreduce.tensorflow as hvd
    from netreduce.errors import NegotiationError, NetReduceError

MODES = ["eager", "function"]


initialized = initialized_by("netreduce.tensorflow")


def _call(mode, fn, *args):
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


def _rows(r):
    return r + 1  # rank r's first dimension where ranks differ


def _block(r, rows, cols=3, dtype=np.float32):
    """Rank r's data: distinct per rank, row and column."""
    return (np.arange(rows * cols).reshape(rows, cols) + 100 * r).astype(dtype)


# --- allgather ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_allgather_gradient_is_own_rows_of_the_average(mode):
    rank, size = hvd.rank(), hvd.size()
    total = sum(_rows(r) for r in range(size))
    weights = tf.constant(np.arange(total * 3, dtype=np.float32).reshape(total, 3))
    x = tf.Variable(_block(rank, _rows(rank)))

    def run(x):
        with tf.GradientTape() as tape:
            y = hvd.allgather(x)
            loss = tf.reduce_sum(y * weights) * float(rank + 1)  # a per-rank loss
        return y, tape.gradient(loss, x)
    y, g = _call(mode, run, x)
    assert np.array_equal(y.numpy(), np.concatenate([_block(r, _rows(r)) for r in range(size)]))
    start = sum(_rows(r) for r in range(rank))
    mean_factor = sum(r + 1 for r in range(size)) / size
    np.testing.assert_allclose(g.numpy(), weights.numpy()[start:start + _rows(rank)] * mean_factor)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather_mixed_dtypes_and_gradient(mode):
    rank, size = hvd.rank(), hvd.size()
    a = tf.Variable(_block(rank, _rows(rank), 2, np.float32))
    b = tf.Variable(_block(rank, 2, 4, np.float64))
    ints = tf.constant(_block(rank, _rows(rank), 1, np.int32))

    def run(a, b, ints):
        with tf.GradientTape() as tape:
            ya, yb = hvd.grouped_allgather([a, b])
            loss = tf.reduce_sum(ya) * 2.0 + tf.cast(tf.reduce_sum(yb), tf.float32) * 3.0
        return ya, yb, hvd.grouped_allgather([ints])[0], tape.gradient(loss, [a, b])
    ya, yb, yi, (ga, gb) = _call(mode, run, a, b, ints)
    assert ya.dtype == tf.float32 and yb.dtype == tf.float64 and yi.dtype == tf.int32
    assert np.array_equal(ya.numpy(), np.concatenate([_block(r, _rows(r), 2) for r in range(size)]))
    assert np.array_equal(yb.numpy(), np.concatenate([_block(r, 2, 4, np.float64)
                                                      for r in range(size)]))
    assert np.array_equal(yi.numpy(), np.concatenate([_block(r, _rows(r), 1, np.int32)
                                                      for r in range(size)]))
    assert np.allclose(ga.numpy(), 2.0) and ga.shape == a.shape
    assert np.allclose(gb.numpy(), 3.0) and gb.shape == b.shape


# --- reducescatter -------------------------------------------------------------------------
def _shard(rows, size, rank):
    base, extra = divmod(rows, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_sum_average_uneven_and_scaled(mode):
    rank, size = hvd.rank(), hvd.size()
    rows = 2 * size + 1  # uneven: the first rank gets a row more
    for dtype in (np.int32, np.float32, np.float64, np.float16):
        every = [_block(r, rows, 2, dtype) for r in range(size)]
        total = np.sum([e.astype(np.float64) for e in every], axis=0)
        start, count = _shard(rows, size, rank)
        x = tf.constant(every[rank])
        summed, averaged, scaled = _call(mode, lambda x: (
            hvd.reducescatter(x, op=hvd.Sum), hvd.reducescatter(x),
            hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)), x)
        assert summed.shape == (count, 2) and summed.dtype == x.dtype, (mode, dtype)
        mine = total[start:start + count]
        assert np.array_equal(summed.numpy().astype(np.float64), mine), (mode, dtype)
        assert np.array_equal(scaled.numpy().astype(np.float64), mine), (mode, dtype)
        if dtype != np.int32:
            np.testing.assert_allclose(averaged.numpy().astype(np.float64), mine / size,
                                       rtol=1e-3 if dtype == np.float16 else 1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_gradient(mode):
    """Horovod's: the allgather of the gradient, times size for Sum, times the scale
    factors."""
    rank, size = hvd.rank(), hvd.size()
    x = tf.Variable(tf.ones([2 * size, 3]))

    def run(x):
        with tf.GradientTape(persistent=True) as tape:
            s = hvd.reducescatter(x, op=hvd.Sum)
            a = hvd.reducescatter(x, op=hvd.Average, prescale_factor=3.0)
            ls = tf.reduce_sum(s) * float(rank + 1)
            la = tf.reduce_sum(a) * float(rank + 1)
        return tape.gradient(ls, x), tape.gradient(la, x)
    gs, ga = _call(mode, run, x)
    per_rank = np.repeat(np.arange(1, size + 1, dtype=np.float32), 2)[:, None] * np.ones([1, 3])
    np.testing.assert_allclose(gs.numpy(), per_rank * size)
    np.testing.assert_allclose(ga.numpy(), per_rank * 3.0)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_reducescatter_and_gradient(mode):
    rank, size = hvd.rank(), hvd.size()
    xs = [tf.Variable(_block(rank, size + 1, 2)), tf.Variable(_block(rank, 3 * size, 1))]

    def run(a, b):
        with tf.GradientTape() as tape:
            ya, yb = hvd.grouped_reducescatter([a, b], op=hvd.Sum)
            loss = tf.reduce_sum(ya) + 2.0 * tf.reduce_sum(yb)
        return ya, yb, tape.gradient(loss, [a, b])
    ya, yb, (ga, gb) = _call(mode, run, *xs)
    for y, rows, cols in ((ya, size + 1, 2), (yb, 3 * size, 1)):
        total = np.sum([_block(r, rows, cols) for r in range(size)], axis=0)
        start, count = _shard(rows, size, rank)
        assert np.array_equal(y.numpy(), total[start:start + count])
    np.testing.assert_allclose(ga.numpy(), np.full([size + 1, 2], float(size)))
    np.testing.assert_allclose(gb.numpy(), np.full([3 * size, 1], 2.0 * size))


def test_reducescatter_refuses_scalars():
    with pytest.raises(tf.errors.InvalidArgumentError, match="scalar"):
        hvd.reducescatter(tf.constant(1.0))
    with pytest.raises(ValueError, match="scalar"):
        tf.function(lambda: hvd.grouped_reducescatter([tf.constant(1.0)]))()


# --- alltoall ------------------------------------------------------------------------------
def _sent(src, dst, trailing=2, dtype=np.float32):
    """What rank ``src`` sends rank ``dst``: dst + 1 rows naming both."""
    rows = dst + 1
    return (np.arange(rows * trailing).reshape(rows, trailing) + 1000 * src + 100 * dst) \
        .astype(dtype)


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_with_splits(mode):
    rank, size = hvd.rank(), hvd.size()
    for dtype in (np.float32, np.int32, np.float64, np.bool_, np.uint8):
        send = np.concatenate([_sent(rank, q, dtype=dtype) for q in range(size)])
        splits = tf.constant([q + 1 for q in range(size)], dtype=tf.int32)
        out, received = _call(mode, lambda x, s: hvd.alltoall(x, splits=s),
                              tf.constant(send), splits)
        want = np.concatenate([_sent(q, rank, dtype=dtype) for q in range(size)])
        assert out.dtype.as_numpy_dtype == dtype and np.array_equal(out.numpy(), want), (mode, dtype)
        assert received.dtype == tf.int32 and received.numpy().tolist() == [rank + 1] * size


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_equal_split_empty_and_silent_rank(mode):
    rank, size = hvd.rank(), hvd.size()
    x = tf.constant(np.arange(size * 2 * 3).reshape(size * 2, 3) + 100 * rank, tf.float32)
    out = _call(mode, hvd.alltoall, x)  # no splits: equal parts, one result
    want = np.concatenate([(np.arange(size * 2 * 3).reshape(size * 2, 3) + 100 * q)[2 * rank:2 * rank + 2]
                           for q in range(size)])
    assert isinstance(out, tf.Tensor) and np.array_equal(out.numpy(), want)
    # nothing sent by anyone
    empty, got = _call(mode, lambda x: hvd.alltoall(x, splits=tf.zeros([size], tf.int32)),
                       tf.zeros([0, 4]))
    assert empty.shape == (0, 4) and got.numpy().tolist() == [0] * size
    # rank 0 sends nothing; the others send one row to everyone
    silent = tf.zeros([size], tf.int32) if rank == 0 else tf.ones([size], tf.int32)
    rows = tf.zeros([0, 2]) if rank == 0 else tf.fill([size, 2], float(rank))
    out, got = _call(mode, lambda x, s: hvd.alltoall(x, splits=s), rows, silent)
    assert got.numpy().tolist() == [0] + [1] * (size - 1)
    assert np.array_equal(out.numpy(), np.array([[q, q] for q in range(1, size)], np.float32)
                          .reshape(-1, 2))


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_gradient_goes_back_with_received_splits(mode):
    rank, size = hvd.rank(), hvd.size()
    send = np.concatenate([_sent(rank, q) for q in range(size)])
    x = tf.Variable(send)
    splits = tf.constant([q + 1 for q in range(size)], tf.int32)

    def run(x):
        with tf.GradientTape() as tape:
            out, received = hvd.alltoall(x, splits=splits)
            # the rows received from rank q weigh q + 1
            weight = tf.repeat(tf.range(1, size + 1, dtype=tf.float32), received)
            loss = tf.reduce_sum(out * weight[:, None])
        return tape.gradient(loss, x)
    g = _call(mode, run, x).numpy()
    # the rows this rank sent to rank q came back weighted by this rank's index + 1
    np.testing.assert_allclose(g, np.full(send.shape, float(rank + 1)))


def test_alltoall_model_parallel_embedding_matches_one_process():
    """The model-parallel use: each rank holds the embedding rows it owns (id % size),
    ids travel to their owners and vectors back by alltoall, the dense layer is data
    parallel. The owners' gradients (through both alltoalls, kept local by
    register_local_source) and the dense gradient equal a single-process run that
    holds the whole table and averages the ranks' losses."""
    rank, size = hvd.rank(), hvd.size()
    vocab, dim, batch = 4 * size, 3, 5
    rng = np.random.default_rng(11)
    table = rng.normal(size=(vocab, dim)).astype(np.float32)
    kernel = rng.normal(size=(dim, 1)).astype(np.float32)
    batches = [rng.integers(0, vocab, size=batch) for _ in range(size)]
    owned = np.arange(rank, vocab, size)  # this rank's rows of the table
    shard = tf.Variable(table[owned])
    dense = tf.Variable(kernel)

    def local_loss(vectors):
        return tf.reduce_mean(tf.square(tf.matmul(vectors, dense) - 1.0))

    @tf.function
    def step(ids):
        owner = ids % size
        order = tf.argsort(owner, stable=True)
        splits = tf.math.bincount(tf.cast(owner, tf.int32), minlength=size, maxlength=size)
        with tf.GradientTape() as tape:
            asked, asked_splits = hvd.alltoall(tf.gather(ids, order), splits=splits)
            looked_up = tf.gather(shard, asked // size)
            back, _ = hvd.alltoall(looked_up, splits=asked_splits)
            vectors = tf.scatter_nd(order[:, None], back, [batch, dim])  # the batch's order
            loss = local_loss(vectors)
        tape = hvd.DistributedGradientTape(tape)
        tape.register_local_source(shard)
        return tape.gradient(loss, [shard, dense])
    g_shard, g_dense = step(tf.constant(batches[rank], tf.int64))

    full, ref_dense = tf.Variable(table), tf.Variable(kernel)
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_mean(tf.square(tf.matmul(tf.gather(full, b), ref_dense) - 1.0))
                         for b in batches]) / size
    ref_table, ref_kernel = tape.gradient(loss, [full, ref_dense])
    np.testing.assert_allclose(g_dense.numpy(), ref_kernel.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf.convert_to_tensor(g_shard).numpy(),
                               tf.convert_to_tensor(ref_table).numpy()[owned],
                               rtol=1e-5, atol=1e-6)


def test_alltoall_bad_splits_are_invalid_arguments():
    size = hvd.size()
    with pytest.raises(tf.errors.InvalidArgumentError, match="even multiple"):
        hvd.alltoall(tf.ones([size + 1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="greater than the first"):
        hvd.alltoall(tf.ones([size - 1]), splits=tf.ones([size], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="number of workers"):
        tf.function(lambda: hvd.alltoall(tf.ones([4]), splits=tf.ones([size + 1], tf.int32)))()
    # splits known only when the graph runs: the kernel refuses them
    f = tf.function(lambda x, s: hvd.alltoall(x, splits=s))
    with pytest.raises(tf.errors.InvalidArgumentError, match="greater than the first"):
        f(tf.ones([1]), tf.fill([size], 2))


# --- error types: Horovod's, eagerly and in a graph ----------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_mismatches_are_failed_preconditions(mode):
    """Ranks that disagree about a tensor get tf.errors.FailedPreconditionError (eagerly
    also a netreduce NegotiationError), naming the tensor, and the job goes on."""
    rank, size = hvd.rank(), hvd.size()
    cases = [
        ("allgather trailing", lambda: hvd.allgather(tf.ones([2, 2 + rank]), name=f"{mode}.ag.shape")),
        ("allgather dtype", lambda: hvd.allgather(tf.ones([2], tf.int32 if rank % 2 else tf.float32),
                                                  name=f"{mode}.ag.dtype")),
        ("broadcast root", lambda: hvd.broadcast(tf.ones([2]), root_rank=rank, name=f"{mode}.bc.root")),
        ("broadcast shape", lambda: hvd.broadcast(tf.ones([1 + rank]), 0, name=f"{mode}.bc.shape")),
        ("alltoall dtype", lambda: hvd.alltoall(tf.ones([size], tf.int32 if rank % 2 else tf.float32),
                                                name=f"{mode}.a2a.dtype")),
        ("alltoall trailing", lambda: hvd.alltoall(tf.ones([size, 1 + rank]), name=f"{mode}.a2a.shape")),
        ("reducescatter shape", lambda: hvd.reducescatter(tf.ones([size, 1 + rank]),
                                                          name=f"{mode}.rs.shape")),
        ("allreduce dtype", lambda: hvd.allreduce(tf.ones([2], tf.int32 if rank % 2 else tf.float32),
                                                  name=f"{mode}.ar.dtype")),
    ]
    for what, fn in cases:
        with pytest.raises(tf.errors.FailedPreconditionError) as info:
            _call(mode, fn)
        assert f"{mode}." in str(info.value), what
        if mode == "eager":
            assert isinstance(info.value, NegotiationError) and \
                isinstance(info.value, NetReduceError), what
    assert np.allclose(hvd.allreduce(tf.ones([3]), op=hvd.Sum).numpy(), size)


# --- process sets --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_process_set_collectives(mode):
    rank, size = hvd.rank(), hvd.size()
    members = [0, size - 1]
    ps = hvd.add_process_set(members)
    try:
        if rank not in members:
            assert not ps.included()
            return
        me, n = members.index(rank), len(members)

        def run(x):
            return (hvd.allreduce(x, op=hvd.Sum, process_set=ps),
                    hvd.allgather(x, process_set=ps),
                    hvd.broadcast(x, root_rank=size - 1, process_set=ps),
                    hvd.reducescatter(tf.tile(x, [n]), op=hvd.Sum, process_set=ps),
                    hvd.alltoall(tf.tile(x, [n]), process_set=ps))
        x = tf.fill([2], float(rank + 1))
        summed, gathered, bcast, scattered, exchanged = _call(mode, run, x)
        values = [float(r + 1) for r in members]
        assert np.allclose(summed.numpy(), sum(values))
        assert np.array_equal(gathered.numpy(), np.repeat(values, 2))
        assert np.allclose(bcast.numpy(), float(size))
        assert np.allclose(scattered.numpy(), sum(values)) and scattered.shape == (2,)
        assert np.array_equal(exchanged.numpy(), np.repeat(values, 2))
        assert hvd.size_op(ps.process_set_id).numpy() == n and ps.rank() == me
        assert hvd.allgather_object(rank, process_set=ps) == members
    finally:
        hvd.remove_process_set(ps)


def test_partial_distributed_gradient_tape_keeps_local_layers_local():
    rank, size = hvd.rank(), hvd.size()
    shared, local = tf.keras.layers.Dense(2), tf.keras.layers.Dense(1)
    x = tf.constant(np.ones([3, 4], np.float32) * (rank + 1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(local(shared(x)))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
    grads = tape.gradient(loss, shared.trainable_weights + local.trainable_weights)
    with tf.GradientTape() as plain:
        again = tf.reduce_sum(local(shared(x)))
    own = plain.gradient(again, shared.trainable_weights + local.trainable_weights)
    for g, o in zip(grads[2:], own[2:]):  # local: this rank's own, over size
        np.testing.assert_allclose(g.numpy(), o.numpy() / size, rtol=1e-5)
    for g in grads[:2]:  # shared: averaged, the same on every rank
        every = hvd.allgather_object(g.numpy())
        assert all(np.allclose(e, every[0]) for e in every)
    with tf.GradientTape() as again_tape:
        again = tf.reduce_sum(local(shared(x)))
    tape = hvd.PartialDistributedGradientTape(again_tape, local_layers=[local])
    mine, common = tape.get_local_and_global_gradients(
        again, shared.trainable_weights + local.trainable_weights)
    assert [id(v) for v, _ in mine] == [id(v) for v in local.trainable_weights]
    assert [id(v) for v, _ in common] == [id(v) for v in shared.trainable_weights]
    np.testing.assert_allclose(mine[0][1].numpy(), own[2].numpy() / size, rtol=1e-5)
