"""Keras 3 on netreduce: DistributedOptimizer + callbacks under compile/fit, and the
tf.distribute path (CrossDeviceOps in a plain MirroredStrategy, and Strategy()).

Each distributed fit is compared with the same model trained in this very process on
the whole data set without any distribution: the ranks must end with the same weights
as that single-process run (so the loss is not scaled N times), identical on every rank.
Started on every rank by tests/parallel/test_tensorflow_launch.py.
"""
import numpy as np
import pytest

from tests.parallel.launched import LAUNCHED, initialized_by, only_when_launched_by, skip_module_unless_launched

pytestmark = only_when_launched_by("tests/parallel/test_tensorflow_launch.py")
skip_module_unless_launched(pytestmark)  # before TensorFlow's import

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

if LAUNCHED:
    import netreduce.tensorflow as nrtf
    import netreduce.tensorflow.keras as hvd

FEATURES, PER_RANK_BATCH = 6, 4


initialized = initialized_by("netreduce.tensorflow.keras", barrier_in="netreduce.tensorflow")


def _data(rows_per_rank=24):
    rng = np.random.default_rng(7)
    n = hvd.size() * rows_per_rank
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1)) + 0.3).astype("float32")
    return x, y


def _model():
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def _weights(model):
    return [w.numpy().copy() for w in model.weights]


def _initial_weights():
    """Rank 0's random initial weights, on every rank."""
    keras.utils.set_random_seed(1000 + hvd.rank())  # every rank draws differently
    return hvd.broadcast_object(_weights(_model()), root_rank=0)


def _reference(init, x, y, batch, epochs):
    """The single-process run: the whole data set, the global batch."""
    model = _model()
    model.set_weights(init)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    return _weights(model), history.history["loss"]


def _assert_same_everywhere(weights):
    flat = np.concatenate([w.ravel() for w in weights])
    gathered = hvd.allgather_object(flat)
    for r, other in enumerate(gathered):
        assert np.array_equal(other, flat), f"rank {r} ended with other weights"


def test_distributed_optimizer_fit_matches_single_process():
    rank, size = hvd.rank(), hvd.size()
    x, y = _data()
    init = _initial_weights()
    keras.utils.set_random_seed(rank)
    model = _model()  # this rank's own random init: the callback must replace it
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05))
    assert isinstance(opt, keras.optimizers.SGD)
    model.compile(optimizer=opt, loss="mse")
    if rank == 0:
        model.set_weights(init)
    # rank r's k-th batch is rows r, r+N, ...: together the ranks' k-th batches are
    # exactly the single-process run's k-th global batch
    history = model.fit(x[rank::size], y[rank::size], batch_size=PER_RANK_BATCH, epochs=3,
                        shuffle=False, verbose=0,
                        callbacks=[hvd.BroadcastGlobalVariablesCallback(0),
                                   hvd.MetricAverageCallback()])
    ref_weights, ref_loss = _reference(init, x, y, PER_RANK_BATCH * size, 3)
    for got, want in zip(_weights(model), ref_weights):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    _assert_same_everywhere(_weights(model))
    losses = history.history["loss"]
    assert losses[-1] < losses[0]
    # MetricAverageCallback: every rank reports the same (averaged) epoch loss
    assert len({tuple(h) for h in hvd.allgather_object(losses)}) == 1
    np.testing.assert_allclose(losses, ref_loss, rtol=0.05)


def test_metric_average_callback_averages_logs():
    logs = {"loss": float(hvd.rank()), "acc": 1.0 + hvd.rank(), "note": "text"}
    cb = hvd.MetricAverageCallback()
    cb.on_epoch_end(0, logs)
    mean = (hvd.size() - 1) / 2
    assert logs == {"loss": pytest.approx(mean), "acc": pytest.approx(1 + mean), "note": "text"}


def test_mirrored_strategy_with_cross_device_ops():
    """A plain MirroredStrategy counts local replicas only, so Keras divides the loss by
    1: the cross-process SUM of gradients must average over processes (else the update
    is N times too large), and replica all_reduce sees through the one-worker shortcut."""
    rank, size = hvd.rank(), hvd.size()
    strategy = tf.distribute.MirroredStrategy(cross_device_ops=nrtf.CrossDeviceOps())
    assert strategy.num_replicas_in_sync == 1

    @tf.function
    def replica_sums():
        ctx = tf.distribute.get_replica_context()
        value = tf.constant([float(rank + 1)] * 3)
        return ctx.all_reduce("SUM", value), ctx.all_reduce("MEAN", value)
    summed, mean = strategy.run(replica_sums)
    expected = sum(r + 1 for r in range(size)) / size
    assert np.allclose(summed.numpy(), expected) and np.allclose(mean.numpy(), expected)

    x, y = _data()
    init = _initial_weights()
    with strategy.scope():
        model = _model()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    model.set_weights(init)
    model.fit(x[rank::size], y[rank::size], batch_size=PER_RANK_BATCH, epochs=2,
              shuffle=False, verbose=0)
    ref_weights, _ = _reference(init, x, y, PER_RANK_BATCH * size, 2)
    for got, want in zip(_weights(model), ref_weights):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    _assert_same_everywhere(_weights(model))


def test_strategy_reductions_span_every_process():
    rank, size = hvd.rank(), hvd.size()
    strategy = nrtf.Strategy()
    assert strategy.num_replicas_in_sync == size
    total = sum(r + 1 for r in range(size))

    @tf.function
    def replica_sums():
        ctx = tf.distribute.get_replica_context()
        f = tf.constant(float(rank + 1))
        i = tf.constant(rank + 1)  # int32: TF would reduce it inside the process only
        return ctx.all_reduce("SUM", f), ctx.all_reduce("SUM", i), ctx.all_reduce("MEAN", f), \
            ctx.replica_id_in_sync_group
    s, i, m, rid = strategy.run(replica_sums)
    assert s.numpy() == total and i.numpy() == total and i.dtype == tf.int32
    assert np.isclose(m.numpy(), total / size) and int(rid) == rank
    per_replica = strategy.run(lambda: tf.constant(float(rank + 1)))
    assert strategy.reduce("SUM", per_replica, axis=None).numpy() == total
    assert np.isclose(strategy.reduce("MEAN", per_replica, axis=None).numpy(), total / size)


def test_strategy_fit_matches_single_process():
    """Keras fit inside Strategy().scope(): the global batch is split between the
    processes, the loss divided by the global replica count, gradients summed over all
    of them — the single-process run on the same data with the same batch."""
    size = hvd.size()
    x, y = _data()
    init = _initial_weights()
    strategy = nrtf.Strategy()
    with strategy.scope():
        model = _model()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    model.set_weights(init)
    batch = PER_RANK_BATCH * size
    history = model.fit(x, y, batch_size=batch, epochs=3, shuffle=False, verbose=0)
    ref_weights, ref_loss = _reference(init, x, y, batch, 3)
    for got, want in zip(_weights(model), ref_weights):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    _assert_same_everywhere(_weights(model))
    # the loss metric is aggregated over the processes too: the global epoch loss
    np.testing.assert_allclose(history.history["loss"], ref_loss, rtol=0.05)


def test_learning_rate_warmup_and_schedule_callbacks():
    """Warmup from lr/size to lr over the first epochs (every batch), then a staircase
    schedule; the value Keras applies is the optimizer's variable, so every step of
    the compiled train function uses it."""
    size = hvd.size()
    lr, steps = 0.4, 4
    x, y = _data(rows_per_rank=steps * PER_RANK_BATCH // size + 1)
    model = _model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr)), loss="mse")
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(self.model.optimizer.learning_rate.numpy()))
    model.fit(x[:steps * PER_RANK_BATCH], y[:steps * PER_RANK_BATCH], batch_size=PER_RANK_BATCH,
              epochs=4, verbose=0, shuffle=False,
              callbacks=[hvd.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=2),
                         hvd.LearningRateScheduleCallback(initial_lr=lr, multiplier=0.5,
                                                          start_epoch=2, end_epoch=4),
                         Record()])
    assert len(seen) == 4 * steps
    for i, got in enumerate(seen[:2 * steps]):
        epoch = i / steps + 1.0 / steps
        np.testing.assert_allclose(got, lr / size * (epoch * (size - 1) / 2 + 1), rtol=1e-6)
    np.testing.assert_allclose(seen[2 * steps:3 * steps], [lr] * steps, rtol=1e-6)
    np.testing.assert_allclose(seen[3 * steps:], [lr * 0.5] * steps, rtol=1e-6)


def test_keras_state_sync_restore_commit():
    rank = hvd.rank()
    model = _model()
    model.build((None, FEATURES))
    keras.utils.set_random_seed(50 + rank)
    for w in model.weights:
        w.assign(np.full(w.shape, float(rank + 1), np.float32))
    state = hvd.elastic.KerasState(model, keras.optimizers.SGD(0.1), batch=20 + rank,
                                   epoch=10 + rank)
    state.sync()
    assert all(np.all(w.numpy() == 1.0) for w in model.weights)
    assert (state.batch, state.epoch) == (20, 10)
    for w in model.weights:
        w.assign(np.full(w.shape, 5.0, np.float32))
    state.batch = 21
    state.restore()
    assert all(np.all(w.numpy() == 1.0) for w in model.weights) and state.batch == 20
    for w in model.weights:
        w.assign(np.full(w.shape, 5.0, np.float32))
    state.epoch = 11
    state.commit()
    state.restore()
    assert all(np.all(w.numpy() == 5.0) for w in model.weights) and state.epoch == 11


def test_partial_distributed_optimizer_keeps_local_layers_local():
    rank, size = hvd.rank(), hvd.size()
    model = _model()
    model.build((None, FEATURES))
    for w in model.weights:
        w.assign(np.full(w.shape, 0.1 * (rank + 1), np.float32))
    local = model.layers[:1]
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=local)
    x, _ = _data()
    before = [w.numpy().copy() for w in model.trainable_weights]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x[:4]) * float(rank + 1))
    grads = tape.gradient(loss, model.trainable_weights)
    opt.apply(grads, model.trainable_weights)
    local_ids = {id(v) for layer in local for v in layer.trainable_weights}
    for w, b, g in zip(model.trainable_weights, before, grads):
        step = b - w.numpy()
        if id(w) in local_ids:  # this rank's own gradient, over size
            np.testing.assert_allclose(step, g.numpy() / size, rtol=1e-5, atol=1e-6)
        else:  # the average of every rank's gradient: the same step everywhere
            steps = hvd.allgather_object(step)
            assert all(np.allclose(s, steps[0]) for s in steps)


def test_load_model_comes_back_distributed_with_its_state(tmp_path_factory):
    rank = hvd.rank()
    x, y = _data()
    model = _model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(x, y, batch_size=PER_RANK_BATCH, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.BroadcastGlobalVariablesCallback(0)])
    path = hvd.broadcast_object(str(tmp_path_factory.mktemp("saved") / "m.keras"), 0)
    if rank == 0:
        model.save(path)
    hvd.allgather_object(None)  # saved before anyone loads
    loaded = hvd.load_model(path)
    from netreduce.tensorflow.keras.optimizer import _DistributedOptimizer
    assert isinstance(loaded.optimizer, _DistributedOptimizer)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert int(loaded.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy())
    loaded.fit(x[rank::hvd.size()], y[rank::hvd.size()], batch_size=PER_RANK_BATCH, epochs=1,
               verbose=0, shuffle=False)
    _assert_same_everywhere(_weights(loaded))


def test_sync_batch_normalization_uses_the_global_batch():
    """Training-mode output of SyncBatchNormalization on each rank's slice equals plain
    BatchNormalization on the whole batch, and so do the moving statistics."""
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng(3)
    batch = rng.normal(size=(4 * size, 5)).astype(np.float32) * 3 + 1
    sync = nrtf.SyncBatchNormalization(momentum=0.5)
    plain = keras.layers.BatchNormalization(momentum=0.5)
    mine = batch[4 * rank:4 * rank + 4]
    got = sync(mine, training=True).numpy()
    want = plain(batch, training=True).numpy()[4 * rank:4 * rank + 4]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(sync.moving_mean.numpy(), plain.moving_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(sync.moving_variance.numpy(), plain.moving_variance.numpy(),
                               rtol=1e-4)
