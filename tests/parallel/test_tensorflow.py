"""netreduce.tensorflow's Horovod-style API, checked the way Horovod's
test/parallel/test_tensorflow.py checks horovod.tensorflow, eagerly and inside
tf.function.

These tests run on every rank at once; tests/parallel/test_tensorflow_launch.py starts
them (with test_tensorflow_keras.py) under netreduce-run with 2 and 3 ranks. Run
directly without a launcher they are skipped.
"""
import itertools

import numpy as np
import pytest

from tests.parallel.launched import LAUNCHED, initialized_by, only_when_launched_by, skip_module_unless_launched

pytestmark = only_when_launched_by("tests/parallel/test_tensorflow_launch.py")
skip_module_unless_launched(pytestmark)  # before TensorFlow's import

tf = pytest.importorskip("tensorflow")

if LAUNCHED:
    import netreduce.tensorflow as hvd
    from netreduce.errors import NegotiationError

DTYPES = [tf.int32, tf.int64, tf.float16, tf.float32, tf.float64, tf.bfloat16, tf.uint8,
          tf.int8, tf.int16, tf.uint16]
DIMS = [0, 1, 2, 3]
MODES = ["eager", "function"]


initialized = initialized_by("netreduce.tensorflow")


def _random(dim, dtype, seed=1234):
    rng = np.random.default_rng(seed)
    low = 0 if dtype.is_unsigned else -20
    return tf.cast(tf.constant(rng.integers(low, 20, size=[5] * dim)), dtype)


def _close(actual, expected, dtype):
    a, e = tf.cast(actual, tf.float64).numpy(), tf.cast(expected, tf.float64).numpy()
    if dtype.is_integer:
        return np.array_equal(a, e)
    tol = 5e-2 if dtype in (tf.float16, tf.bfloat16) else 1e-6
    return np.allclose(a, e, rtol=tol, atol=tol)


def _call(mode, fn, *args):
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_sum_and_average(mode):
    size = hvd.size()
    for dtype, dim in itertools.product(DTYPES, DIMS):
        t = _random(dim, dtype)
        summed, averaged = _call(mode, lambda x: (hvd.allreduce(x, op=hvd.Sum),
                                                  hvd.allreduce(x)), t)
        assert summed.dtype == dtype and summed.shape == t.shape, (dtype, dim)
        expected = tf.cast(tf.cast(t, tf.float64) * size, dtype) if dtype != tf.uint8 \
            else tf.constant((t.numpy().astype(np.int64) * size).astype(np.uint8))
        assert _close(summed, expected, dtype), (mode, dtype, dim)
        assert _close(averaged, t, dtype), (mode, dtype, dim)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_min_max(mode):
    size, rank = hvd.size(), hvd.rank()
    for dtype, dim in itertools.product([tf.int32, tf.float32, tf.float64], [1, 2]):
        every = np.stack([_random(dim, dtype, seed=100 + r).numpy() for r in range(size)])
        mine = tf.constant(every[rank])
        lo, hi = _call(mode, lambda x: (hvd.allreduce(x, op=hvd.Min),
                                        hvd.allreduce(x, op=hvd.Max)), mine)
        assert np.array_equal(lo.numpy(), every.min(axis=0)), (mode, dtype, dim)
        assert np.array_equal(hi.numpy(), every.max(axis=0)), (mode, dtype, dim)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_prescale_postscale(mode):
    size = hvd.size()
    for dtype in [tf.int32, tf.float16, tf.float32, tf.float64]:
        t = _random(2, dtype)
        out = _call(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0,
                                                  postscale_factor=0.25), t)
        expected = tf.cast(tf.cast(t, tf.float64) * 2.0 * size * 0.25, dtype)
        assert _close(out, expected, dtype), (mode, dtype)
    # Average applies 1/size after the postscale
    out = hvd.allreduce(tf.ones([4]), prescale_factor=3.0, postscale_factor=0.5)
    assert np.allclose(out.numpy(), 1.5)


def test_allreduce_fp16_compression_and_variables():
    v = tf.Variable(tf.fill([7], 1.5))
    out = hvd.allreduce(v, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == tf.float32 and np.allclose(out.numpy(), 1.5 * hvd.size())


def test_allreduce_bool_is_refused_with_the_tensor_name():
    with pytest.raises(ValueError, match="bool"):
        hvd.allreduce(tf.constant([True, False]), name="flags")


def test_allreduce_shape_mismatch_names_tensor_and_ranks():
    """Horovod's type (tf.errors.FailedPreconditionError) and netreduce's (a
    NegotiationError, so a NetReduceError), with netreduce's message."""
    rank = hvd.rank()
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        hvd.allreduce(tf.zeros([3 + rank, 2]), name="tf.mismatch.shape")
    assert isinstance(info.value, NegotiationError) and isinstance(info.value, hvd.NetReduceError)
    text = str(info.value)
    assert "tf.mismatch.shape" in text and "rank" in text and "mismatch" in text.lower()
    dtype = tf.int32 if rank % 2 == 0 else tf.float32
    with pytest.raises(tf.errors.FailedPreconditionError, match="tf.mismatch.dtype"):
        hvd.allreduce(tf.zeros([4], dtype=dtype), name="tf.mismatch.dtype")


def test_allreduce_mismatch_inside_tf_function_names_the_tensor():
    rank = hvd.rank()
    f = tf.function(lambda x: hvd.allreduce(x, name="tf.mismatch.graph"))
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        f(tf.zeros([2 + rank]))
    assert "tf.mismatch.graph" in str(info.value) and "rank" in str(info.value)
    # the job goes on afterwards
    assert np.allclose(hvd.allreduce(tf.ones([3]), op=hvd.Sum).numpy(), hvd.size())


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_gradient(mode):
    size = hvd.size()
    for op, factor in ((hvd.Sum, size), (hvd.Average, 1)):
        x = tf.Variable(tf.ones([3, 4]) * (hvd.rank() + 1))

        def grad(x):
            with tf.GradientTape() as tape:
                y = tf.reduce_sum(hvd.allreduce(x, op=op) * 2.0)
            return tape.gradient(y, x)
        g = _call(mode, grad, x)
        assert np.allclose(g.numpy(), 2.0 * factor), (mode, op)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_and_its_gradient(mode):
    size = hvd.size()
    xs = [tf.Variable(tf.ones([2] * (d + 1)) * (hvd.rank() + 1)) for d in range(3)]

    def run(*xs):
        with tf.GradientTape() as tape:
            ys = hvd.grouped_allreduce(list(xs), op=hvd.Sum)
            total = tf.add_n([tf.reduce_sum(y) for y in ys])
        return ys, tape.gradient(total, list(xs))
    ys, grads = _call(mode, run, *xs)
    for y, g in zip(ys, grads):
        assert np.allclose(y.numpy(), size * (size + 1) / 2)
        assert np.allclose(g.numpy(), size)


def _netreduce_nodes(concrete):
    return [op for op in concrete.graph.get_operations() if op.type.startswith("Netreduce")]


def test_distributed_gradient_tape_submits_one_group():
    """A step's gradients are one graph node and one core submission, not one
    blocking call per tensor."""
    rank, size = hvd.rank(), hvd.size()
    ws = [tf.Variable(tf.ones([4, 4]) * (i + 1)) for i in range(5)]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(w * w) for w in ws]) * float(rank + 1)
        return hvd.DistributedGradientTape(tape).gradient(loss, ws)
    assert len(_netreduce_nodes(step.get_concrete_function())) == 1
    mean_factor = sum(r + 1 for r in range(size)) / size
    for i, g in enumerate(step()):
        assert np.allclose(g.numpy(), 2 * (i + 1) * mean_factor), i
    # eagerly too
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(ws[0] * float(rank + 1))
    g = hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, [ws[0]])[0]
    assert np.allclose(g.numpy(), sum(r + 1 for r in range(size)))


def test_gradients_beyond_one_fusion_buffer_go_in_backprop_order():
    """Gradients larger than the core's fusion buffer leave in buffer-sized groups, the
    last layer's first, each its own node: it can start while backprop goes on."""
    from netreduce.api import _communicator
    limit = _communicator().fusion.capacity
    rows = limit // 4 // 64 * 3 // 4  # each kernel ~3/4 of a buffer: two never share one
    ws = [tf.Variable(tf.zeros([rows - i, 64]), name=f"w{i}") for i in range(3)]

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(tf.matmul(x, w, transpose_b=True)) for w in ws])
        return hvd.DistributedGradientTape(tape).gradient(loss, ws)
    nodes = _netreduce_nodes(step.get_concrete_function(tf.TensorSpec([2, 64])))
    assert len(nodes) == 3
    # independent of each other: each starts as soon as its own gradient exists (the
    # core pairs them by name across ranks, whatever order TensorFlow runs them in)
    assert all(not n.control_inputs for n in nodes)
    assert [[t.shape[0] for t in n.inputs] for n in nodes] == [[rows - 2], [rows - 1], [rows]]


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_distributed_gradient_tape_indexed_slices(sparse_as_dense):
    """Embedding gradients are IndexedSlices: all-gathered by default, densified with
    sparse_as_dense; either way the dense equivalent is the average."""
    rank, size = hvd.rank(), hvd.size()
    table = tf.Variable(tf.zeros([6, 3]))
    ids = tf.constant([rank % 6, (rank + 1) % 6])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids)) * float(rank + 1)
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        return tape.gradient(loss, [table])[0]
    g = step()
    assert isinstance(g, tf.Tensor) == sparse_as_dense
    expected = np.zeros([6, 3])
    for r in range(size):
        for i in (r % 6, (r + 1) % 6):
            expected[i] += (r + 1) / size
    assert np.allclose(tf.convert_to_tensor(g).numpy(), expected)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_and_broadcast_variables(mode):
    rank = hvd.rank()
    for dtype in DTYPES + [tf.bool]:
        t = tf.cast(_random(2, tf.int32, seed=rank) % 2, dtype) if dtype == tf.bool \
            else _random(2, dtype, seed=rank)
        root = _random(2, tf.int32, seed=0) % 2 if dtype == tf.bool else _random(2, dtype, seed=0)
        out = _call(mode, lambda x: hvd.broadcast(x, root_rank=0), t)
        assert np.array_equal(out.numpy(), tf.cast(root, dtype).numpy()), (mode, dtype)
    vs = [tf.Variable(tf.fill([3, d + 1], float(rank))) for d in range(4)]
    vs.append(tf.Variable(rank, dtype=tf.int64))
    root_rank = hvd.size() - 1

    def assign_all():
        hvd.broadcast_variables(vs, root_rank=root_rank)  # a tf.group op in a graph
    _call(mode, assign_all)
    for v in vs:
        assert np.all(v.numpy() == root_rank), (mode, v.name)


def test_broadcast_gradient_is_average_on_root_only():
    x = tf.Variable(tf.ones([3]))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(hvd.broadcast(x, root_rank=0) * float(hvd.rank() + 1))
    g = tape.gradient(y, x).numpy()
    expected = sum(r + 1 for r in range(hvd.size())) / hvd.size() if hvd.rank() == 0 else 0
    assert np.allclose(g, expected)


@pytest.mark.parametrize("mode", MODES)
def test_allgather_variable_first_dimension(mode):
    rank, size = hvd.rank(), hvd.size()
    for dtype in [tf.int32, tf.float16, tf.float32, tf.bfloat16, tf.bool]:
        t = tf.cast(tf.fill([rank + 1, 2], rank % 2 if dtype == tf.bool else rank), dtype)
        out = _call(mode, hvd.allgather, t)
        expected = np.concatenate([np.full([r + 1, 2], r % 2 if dtype == tf.bool else r)
                                   for r in range(size)])
        assert out.shape == expected.shape and np.array_equal(
            tf.cast(out, tf.float64).numpy(), expected), (mode, dtype)


def test_objects():
    rank, size = hvd.rank(), hvd.size()
    assert hvd.broadcast_object({"r": rank}, root_rank=1) == {"r": 1}
    assert hvd.allgather_object(("rank", rank)) == [("rank", r) for r in range(size)]


def test_unsupported_ops_and_process_sets_are_refused():
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(tf.ones([2]), op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="process set"):
        hvd.allreduce(tf.ones([2]), process_set=object())
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(tf.ones([2]), root_rank=hvd.size())
