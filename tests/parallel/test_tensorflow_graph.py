"""netreduce.tensorflow in TF1 graph mode: graphs built under ``tf.Graph().as_default()``
and run by ``tf.compat.v1.Session`` (what Horovod's graph half of test_tensorflow.py
exercises), through the asynchronous graph op.

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


initialized = initialized_by("netreduce.tensorflow")


def _session(graph, threads=0):
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads)
    return tf.compat.v1.Session(graph=graph, config=config)


def test_session_runs_independent_collectives_built_in_rank_order():
    """Several collectives with nothing ordering them, added in an order that differs by
    rank, fetched by one session.run on a single inter-op thread: all complete."""
    rank, size = hvd.rank(), hvd.size()
    graph = tf.Graph()
    with graph.as_default():
        xs = [tf.constant(np.full([3], float(10 * i + rank), np.float32)) for i in range(5)]
        order = range(5) if rank % 2 == 0 else reversed(range(5))
        outs = {}
        for i in order:
            outs[i] = (hvd.allreduce(xs[i], op=hvd.Sum) if i % 2 == 0
                       else hvd.allgather(xs[i]))
        with _session(graph, threads=1) as session:
            for _ in range(3):  # the steady state too (cached names)
                got = session.run([outs[i] for i in range(5)])
    for i, value in enumerate(got):
        per_rank = [np.full([3], float(10 * i + r), np.float32) for r in range(size)]
        want = sum(per_rank) if i % 2 == 0 else np.concatenate(per_rank)
        assert np.array_equal(value, want), i


def test_broadcast_inplace_and_global_variables_update_the_variables():
    rank, size = hvd.rank(), hvd.size()
    graph = tf.Graph()
    with graph.as_default():
        a = tf.Variable(np.full([2, 2], float(rank), np.float32))
        b = tf.Variable(np.int64(rank))
        values = hvd.broadcast_([a, b], root_rank=size - 1)
        c = tf.Variable(np.full([3], float(rank), np.float64))
        everything = hvd.broadcast_global_variables(root_rank=0)
        with _session(graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            got = session.run(values)  # fetching the values performs the broadcast
            assert np.all(got[0] == size - 1) and got[1] == size - 1
            assert np.all(session.run(a) == size - 1) and session.run(b) == size - 1
            session.run(tf.compat.v1.assign(b, 40 + rank))
            session.run(everything)  # rank 0's values of a (size - 1 by now), b and c
            assert np.all(session.run(c) == 0) and np.all(session.run(a) == size - 1)
            assert session.run(b) == 40
    with pytest.raises(RuntimeError, match="eager"):
        hvd.broadcast_global_variables(0)


def test_graph_errors_are_failed_preconditions_with_the_message():
    rank = hvd.rank()
    graph = tf.Graph()
    with graph.as_default():
        bad = hvd.allreduce(tf.zeros([2 + rank]), name="graph.mismatch")
        root = hvd.broadcast(tf.zeros([2]), root_rank=rank, name="graph.root")
        fine = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="graph.fine")
        with _session(graph) as session:
            with pytest.raises(tf.errors.FailedPreconditionError, match="graph.mismatch"):
                session.run(bad)
            with pytest.raises(tf.errors.FailedPreconditionError, match="graph.root"):
                session.run(root)
            assert np.allclose(session.run(fine), hvd.size())


def test_gradients_in_a_graph():
    """tf.compat.v1.gradients through allreduce, allgather, alltoall and reducescatter
    (Horovod's gradients)."""
    rank, size = hvd.rank(), hvd.size()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.ones([size, 2], np.float32) * (rank + 1))
        scale = float(rank + 1)
        losses = {
            "allreduce": tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum)) * scale,
            "allgather": tf.reduce_sum(hvd.allgather(x)) * scale,
            "alltoall": tf.reduce_sum(hvd.alltoall(x)) * scale,
            "reducescatter": tf.reduce_sum(hvd.reducescatter(x, op=hvd.Sum)) * scale,
        }
        grads = {k: tf.compat.v1.gradients(v, x)[0] for k, v in losses.items()}
        with _session(graph) as session:
            got = session.run(grads)
    total = sum(r + 1 for r in range(size))
    np.testing.assert_allclose(got["allreduce"], np.full([size, 2], total))
    np.testing.assert_allclose(got["allgather"], np.full([size, 2], total / size))
    # alltoall: row q went to rank q, whose loss weighs it q + 1
    np.testing.assert_allclose(got["alltoall"], np.repeat(np.arange(1, size + 1.0), 2)
                               .reshape(size, 2))
    np.testing.assert_allclose(got["reducescatter"], np.repeat(np.arange(1, size + 1.0) * size, 2)
                               .reshape(size, 2))


def test_tensorflow_state_in_a_session():
    """hvd.elastic.TensorFlowState with a session: sync broadcasts rank 0's values,
    restore rolls back to the last commit."""
    rank = hvd.rank()
    graph = tf.Graph()
    with graph.as_default():
        v = tf.Variable(np.full([2], float(rank), np.float32))
        with _session(graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            state = hvd.elastic.TensorFlowState([v], session=session, epoch=rank)
            state.sync()
            assert np.all(session.run(v) == 0) and state.epoch == 0
            v.load(np.full([2], 7.0, np.float32), session)
            state.epoch = 3
            state.commit()
            v.load(np.full([2], 9.0, np.float32), session)
            state.epoch = 5
            state.restore()
            assert np.all(session.run(v) == 7.0) and state.epoch == 3


def test_distributed_optimizer_v1_minimize_in_a_session():
    """hvd.DistributedOptimizer around a tf.compat.v1 optimizer: minimize() applies the
    averaged gradient, so every rank takes the same step."""
    rank, size = hvd.rank(), hvd.size()
    graph = tf.Graph()
    with graph.as_default():
        w = tf.Variable(np.zeros(3, np.float32))
        loss = tf.reduce_sum(w * tf.constant(np.arange(1, 4, dtype=np.float32) * (rank + 1)))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
        train = opt.minimize(loss)
        with _session(graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train)
            got = session.run(w)
    mean = sum(r + 1 for r in range(size)) / size
    np.testing.assert_allclose(got, -0.5 * mean * np.arange(1, 4))
