"""netreduce.mxnet checked on every rank at once, in MXNet's own environment.

tests/parallel/test_mxnet.py starts this file under netreduce-run with 2 and 3 ranks
and the python of scripts/env_mxnet.sh's venv (mxnet 1.9.1 needs numpy < 1.24). Not
named test_*: the main environment (numpy 2, no mxnet) never collects it.

Every rank runs the same tests in the same order; rank r contributes data that
depends on r, so a missing or partial reduction changes the result.
"""
import hashlib

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

from tests.parallel.launched import LAUNCHED, initialized_by, only_when_launched_by  # noqa: E402

pytestmark = only_when_launched_by("tests/parallel/test_mxnet.py")

if LAUNCHED:
    import netreduce.mxnet as hvd
    from netreduce.mxnet import buffers
    from netreduce.mxnet.kvstore import NetReduce

DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "int8"]
# 1 element, not a multiple of a packet, several packets (payload 65464 B); legacy
# mx.nd reads a 0 in a shape as "unknown", so there are no empty NDArrays to reduce
SHAPES = [(1,), (3, 5, 7), (70001,)]


initialized = initialized_by("netreduce.mxnet")


def _base(shape, dtype):
    n = int(np.prod(shape))
    return (np.arange(n) % 7 + 1).astype(dtype).reshape(shape)


def _digest(params) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(params[name].data().asnumpy().tobytes())
    return h.hexdigest()[:16]


# --- the KVStore ---------------------------------------------------------------------
def test_kvstore_is_registered_and_reports_the_job():
    kv = mx.kv.create("netreduce")
    assert isinstance(kv, NetReduce) and isinstance(kv, mx.kvstore.KVStoreBase)
    assert kv.type == "netreduce"
    assert (kv.rank, kv.num_workers) == (hvd.rank(), hvd.size())
    assert kv.is_capable(mx.kvstore.KVStoreBase.OPTIMIZER)
    with pytest.raises(ValueError, match="Unknown capability"):
        kv.is_capable("sparse")


def test_pushpull_sums_every_dtype_and_shape():
    kv = mx.kv.create("netreduce")
    rank, size = hvd.rank(), hvd.size()
    total = size * (size + 1) // 2
    for dtype in DTYPES:
        for shape in SHAPES:
            base = _base(shape, dtype)
            value = mx.nd.array(base * (rank + 1), dtype=dtype)
            kv.pushpull(f"{dtype}{shape}", value)  # out=None: in place
            expected = (base.astype(np.float64) * total).astype(dtype)
            np.testing.assert_array_equal(value.asnumpy(), expected, err_msg=f"{dtype} {shape}")
            # out= given: value unchanged, out holds the sum
            value = mx.nd.array(base * (rank + 1), dtype=dtype)
            out = mx.nd.zeros(shape, dtype=dtype)
            kv.pushpull(f"{dtype}{shape}.out", value, out=out)
            np.testing.assert_array_equal(out.asnumpy(), expected)
            np.testing.assert_array_equal(value.asnumpy(), base * (rank + 1))


def test_pushpull_lists_of_keys_and_devices():
    kv = mx.kv.create("netreduce")
    rank, size = hvd.rank(), hvd.size()
    total = size * (size + 1) // 2
    values = [mx.nd.full((4, 3), rank + 1), mx.nd.full((1000,), 2 * (rank + 1), dtype="float64")]
    outs = [mx.nd.zeros((4, 3)), mx.nd.zeros((1000,), dtype="float64")]
    kv.pushpull([10, 11], values, out=outs)
    assert np.all(outs[0].asnumpy() == total) and np.all(outs[1].asnumpy() == 2 * total)
    kv.pushpull([10, 11], values)  # in place, several keys
    assert np.all(values[0].asnumpy() == total) and np.all(values[1].asnumpy() == 2 * total)
    # one key, two local copies (what a worker with two devices passes): their sum
    # over devices and workers lands in every copy, or in every out
    copies = [mx.nd.full((5,), rank + 1), mx.nd.full((5,), 10 * (rank + 1))]
    kv.pushpull("two-devices", copies)
    for c in copies:
        assert np.all(c.asnumpy() == 11 * total)
    copies = [mx.nd.full((5,), rank + 1), mx.nd.full((5,), 10 * (rank + 1))]
    outs = [mx.nd.zeros((5,)), mx.nd.zeros((5,))]
    kv.pushpull("two-devices.out", copies, out=outs)
    assert all(np.all(o.asnumpy() == 11 * total) for o in outs)
    assert np.all(copies[0].asnumpy() == rank + 1)


def test_broadcast_from_rank_0():
    kv = mx.kv.create("netreduce")
    rank = hvd.rank()
    for dtype in DTYPES:
        value = mx.nd.array(_base((3, 70), dtype) + rank, dtype=dtype)
        outs = [mx.nd.zeros((3, 70), dtype=dtype), mx.nd.zeros((3, 70), dtype=dtype)]
        kv.broadcast(f"b.{dtype}", value, out=outs)
        for o in outs:
            np.testing.assert_array_equal(o.asnumpy(), _base((3, 70), dtype))
        np.testing.assert_array_equal(value.asnumpy(), _base((3, 70), dtype) + rank)
    # the Trainer's form: value is also the first out; several keys at once
    a, b = mx.nd.full((6,), rank), mx.nd.full((2, 2), 7 + rank)
    kv.broadcast(["x", "y"], [a, b], out=[[a], [b]])
    assert np.all(a.asnumpy() == 0) and np.all(b.asnumpy() == 7)


def test_ndarrays_reach_the_core_without_a_copy():
    a = mx.nd.arange(12).reshape((3, 4))
    buf = buffers.HostBuffer(a, "test", "a", write=True)
    import ctypes
    from mxnet.base import _LIB
    ptr = ctypes.c_void_p()
    _LIB.MXNDArrayGetData(a.handle, ctypes.byref(ptr))
    assert buf.array.ctypes.data == ptr.value  # the NDArray's own memory
    buf.array[1, 2] = -5.0
    assert a.asnumpy()[1, 2] == -5.0
    # a pending engine write is finished before the core may read
    b = mx.nd.zeros((1000, 1000))
    b += 3
    assert np.all(buffers.host_view(b, write=False) == 3)
    with pytest.raises(TypeError, match="dense NDArrays only"):
        buffers.HostBuffer(mx.nd.sparse.zeros("csr", (4, 4)), "test", "s", write=False)
    with pytest.raises(TypeError, match="unsupported dtype bool"):
        buffers.HostBuffer(mx.nd.zeros((2,), dtype="bool"), "test", "s", write=False)


def test_mkldnn_layout_weights_are_read_in_row_major_order():
    """After an inference-mode forward, MKLDNN may keep a conv weight in its own
    blocked layout; the core must still see (and reduce) the logical values."""
    mx.random.seed(3)
    conv = mx.gluon.nn.Conv2D(64, 11, 4, 2)
    conv.initialize(mx.init.Xavier())
    conv(mx.nd.ones((1, 3, 64, 64)))  # not recorded: inference mode
    # the forward only *reads* the weight, yet may reorder it in place: let it finish
    # (MXNet's own asnumpy would otherwise race with it)
    mx.nd.waitall()
    weight = conv.weight.data()
    expected = weight.asnumpy()  # asnumpy reorders to the default layout itself
    view = buffers.HostBuffer(weight, "test", "w", write=False).array
    np.testing.assert_array_equal(view, expected)
    mx.kv.create("netreduce").pushpull("mkldnn-weight", weight)
    np.testing.assert_allclose(weight.asnumpy(), expected * hvd.size(), rtol=1e-6)


def test_optimizer_states_need_an_optimizer():
    kv = mx.kv.create("netreduce")
    with pytest.raises(hvd.NetReduceError, match="no optimizer"):
        kv.save_optimizer_states("/nonexistent/states")
    with pytest.raises(NotImplementedError, match="does not compress"):
        kv.set_gradient_compression({"type": "2bit"})


# --- gluon.Trainer ---------------------------------------------------------------------
BATCH = 8


def _net(seed=0):
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, activation="relu"), mx.gluon.nn.Flatten(),
            mx.gluon.nn.Dense(16, activation="relu"), mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 1, 6, 6)))  # finish deferred initialisation
    return net


def _data(rank, step):
    rng = np.random.RandomState(1000 * step + rank)
    return (mx.nd.array(rng.randn(BATCH, 1, 6, 6)),
            mx.nd.array(rng.randint(0, 3, BATCH)))


def _train(trainer_factory, steps, batch_for_step, ranks_data):
    """Train _net() with the trainer from ``trainer_factory(params)``; ranks_data(s)
    gives the (x, y) this process uses at step s."""
    net = _net()
    trainer = trainer_factory(net.collect_params())
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for s in range(steps):
        x, y = ranks_data(s)
        with mx.autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch_for_step)
    return net, trainer


def _reference(steps, optimizer, optimizer_params):
    """One process, kvstore=None, every rank's batch at once: what data-parallel
    training with a sum of gradients and step(global batch) must reproduce."""
    size = hvd.size()

    def everything(s):
        parts = [_data(r, s) for r in range(size)]
        return mx.nd.concat(*[p[0] for p in parts], dim=0), mx.nd.concat(*[p[1] for p in parts], dim=0)
    net, _ = _train(lambda p: mx.gluon.Trainer(p, optimizer, dict(optimizer_params), kvstore=None),
                    steps, BATCH * size, everything)
    return net


def _check_replicas(net, reference):
    digests = hvd.allgather_object(_digest(net.collect_params()))
    assert len(set(digests)) == 1, f"replicas differ after training: {digests}"
    for (name, p), (_, q) in zip(sorted(net.collect_params().items()),
                                 sorted(reference.collect_params().items())):
        np.testing.assert_allclose(p.data().asnumpy(), q.data().asnumpy(), rtol=2e-4, atol=2e-6,
                                   err_msg=name)


OPT = ("sgd", {"learning_rate": 0.5, "momentum": 0.9})


@pytest.mark.parametrize("how", ["string", "instance", "string-local-update"])
def test_trainer_sums_and_replicas_stay_identical(how):
    """Different data on every rank; step(global batch). The string form must really
    reduce (MXNet's _create_kvstore would drop it for a one-device process). As with
    dist_sync, the Trainer updates on the kvstore by default (the optimizer runs in
    the store, after the sum); update_on_kvstore=False updates in the Trainer."""
    rank, size = hvd.rank(), hvd.size()
    kwargs = {"kvstore": mx.kv.create("netreduce") if how == "instance" else "netreduce"}
    if how == "string-local-update":
        kwargs["update_on_kvstore"] = False
    net, trainer = _train(lambda p: mx.gluon.Trainer(p, OPT[0], dict(OPT[1]), **kwargs),
                          3, BATCH * size, lambda s: _data(rank, s))
    assert isinstance(trainer._kvstore, NetReduce)
    assert trainer._update_on_kvstore == (how != "string-local-update")
    _check_replicas(net, _reference(3, *OPT))


def test_trainer_states_round_trip_with_update_on_kvstore(tmp_path):
    rank, size = hvd.rank(), hvd.size()
    net, trainer = _train(lambda p: mx.gluon.Trainer(p, OPT[0], dict(OPT[1]), kvstore="netreduce"),
                          1, BATCH * size, lambda s: _data(rank, s))
    path = str(tmp_path / f"states.{rank}")
    trainer.save_states(path)
    trainer.load_states(path)
    assert trainer._kvstore._updater.states  # momentum buffers came back


def test_trainer_local_batch_would_scale_by_the_number_of_workers():
    """The documented semantics: a KVStore sums, so step(local batch) takes steps N
    times larger than the single-process reference (as with dist_sync)."""
    rank, size = hvd.rank(), hvd.size()
    opt = ("sgd", {"learning_rate": 0.1})
    net, _ = _train(lambda p: mx.gluon.Trainer(p, opt[0], dict(opt[1]), kvstore="netreduce"),
                    1, BATCH, lambda s: _data(rank, s))
    start, ref = _net(), _reference(1, *opt)
    for (name, p), (_, q), (_, p0) in zip(sorted(net.collect_params().items()),
                                          sorted(ref.collect_params().items()),
                                          sorted(start.collect_params().items())):
        moved = p.data().asnumpy() - p0.data().asnumpy()
        ref_moved = q.data().asnumpy() - p0.data().asnumpy()
        np.testing.assert_allclose(moved, size * ref_moved, rtol=1e-3, atol=1e-6, err_msg=name)


# --- Horovod API -------------------------------------------------------------------------
def test_horovod_collectives():
    rank, size = hvd.rank(), hvd.size()
    x = mx.nd.full((33,), rank + 1.0)
    avg = hvd.allreduce(x)  # Average by default, x untouched
    assert np.allclose(avg.asnumpy(), (size + 1) / 2) and np.all(x.asnumpy() == rank + 1)
    assert np.all(hvd.allreduce(x, op=hvd.Sum).asnumpy() == size * (size + 1) / 2)
    assert np.all(hvd.allreduce(x, op=hvd.Max, name="mx").asnumpy() == size)
    scaled = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert np.allclose(scaled.asnumpy(), size * (size + 1) / 2)
    with pytest.warns(DeprecationWarning):
        assert np.all(hvd.allreduce(x, average=False).asnumpy() == size * (size + 1) / 2)
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    assert hvd.allreduce_(x, op=hvd.Min) is x and np.all(x.asnumpy() == 1)
    group = [mx.nd.full((3,), rank), mx.nd.full((2, 2), 2 * rank, dtype="int32")]
    summed = hvd.grouped_allreduce(group, op=hvd.Sum, name="g")
    assert np.all(summed[0].asnumpy() == size * (size - 1) / 2)
    assert np.all(summed[1].asnumpy() == size * (size - 1)) and summed[1].dtype == np.int32
    assert hvd.grouped_allreduce_(group, op=hvd.Sum)[0] is group[0]
    y = mx.nd.full((5,), 10 + rank)
    assert np.all(hvd.broadcast(y, root_rank=size - 1).asnumpy() == 10 + size - 1)
    assert np.all(y.asnumpy() == 10 + rank)
    assert hvd.broadcast_(y, root_rank=0) is y and np.all(y.asnumpy() == 10)
    assert (hvd.local_rank(), hvd.local_size()) == (rank, size)  # one host
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(x, op=hvd.Adasum)


def test_broadcast_parameters_including_deferred():
    rank = hvd.rank()
    net = _net(seed=rank)  # different initial weights on every rank
    late = mx.gluon.nn.Dense(4)
    late.initialize(mx.init.Uniform(), force_reinit=True)  # deferred until first call
    mx.random.seed(50 + rank)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    hvd.broadcast_parameters(late.collect_params(), root_rank=0, prefix="late.")
    late(mx.nd.ones((2, 3)))  # initialises, then broadcasts
    assert len(set(hvd.allgather_object(_digest(net.collect_params())))) == 1
    assert len(set(hvd.allgather_object(_digest(late.collect_params())))) == 1
    if rank == 0:
        assert _digest(net.collect_params()) == _digest(_net(seed=0).collect_params())


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_distributed_trainer_averages(compression):
    """DistributedTrainer (Horovod semantics): step(local batch) averages, matching
    the single-process reference on the global batch."""
    rank, size = hvd.rank(), hvd.size()
    comp = getattr(hvd.Compression, compression)
    net, trainer = _train(lambda p: hvd.DistributedTrainer(p, OPT[0], dict(OPT[1]),
                                                           compression=comp),
                          3, BATCH, lambda s: _data(rank, s))
    assert trainer._kvstore is None
    if compression == "none":
        _check_replicas(net, _reference(3, *OPT))
    else:  # float16 on the wire: identical replicas, close to the reference
        assert len(set(hvd.allgather_object(_digest(net.collect_params())))) == 1


def test_distributed_trainer_predivide_and_optimizer_unwrap():
    rank, size = hvd.rank(), hvd.size()
    with pytest.warns(UserWarning, match="unwrapped"):
        hvd.DistributedTrainer(_net().collect_params(),
                               hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1)))
    net, _ = _train(lambda p: hvd.DistributedTrainer(p, OPT[0], dict(OPT[1]),
                                                     gradient_predivide_factor=float(size)),
                    2, BATCH, lambda s: _data(rank, s))
    _check_replicas(net, _reference(2, *OPT))


# --- errors (last: they leave failed operations behind) ------------------------------
def test_mismatched_shapes_name_the_key_and_ranks():
    kv = mx.kv.create("netreduce")
    rank = hvd.rank()
    value = mx.nd.zeros((4 + (rank == 1),))
    with pytest.raises(hvd.NetReduceError) as info:
        # pushpull returns before the reduction ends (MXNet's engine finishes it);
        # synchronize(), or else the store's next call, raises what went wrong
        kv.pushpull("mismatch", value)
        kv.synchronize()
    message = str(info.value)
    assert "'kvstore.mismatch'" in message, message  # the key
    assert "rank 1 sent [5]" in message and "[4]" in message, message  # who sent what
    # the job goes on: a well-formed key still reduces, and nothing is raised twice
    ok = mx.nd.ones((3,))
    kv.pushpull("after-mismatch", ok)
    assert np.all(ok.asnumpy() == hvd.size())
    kv.synchronize()
    # without synchronize(), the next call raises it
    kv.pushpull("mismatch.2", mx.nd.zeros((4 + (rank == 1),)))
    mx.nd.waitall()
    with pytest.raises(hvd.NetReduceError, match="'kvstore.mismatch.2'"):
        kv.pushpull("after-mismatch", ok)


def test_pushpull_returns_before_the_reduction_and_mxnet_waits_for_it():
    """The wait is an engine operation: pushpull returns while the reduction may
    still run, and reading the result (an MXNet operation) waits for it."""
    kv = mx.kv.create("netreduce")
    rank, size = hvd.rank(), hvd.size()
    arrays = [mx.nd.full((200000,), rank + 1 + i) for i in range(6)]
    for i, a in enumerate(arrays):
        kv.pushpull(f"burst.{i}", a, priority=-i)
    doubled = [a * 2 for a in arrays]  # queued after each reduction by MXNet's engine
    for i, d in enumerate(doubled):
        assert np.all(d.asnumpy() == 2 * (size * (size + 1) / 2 + size * i)), i
    kv.pushpull("burst.0", arrays[0])  # same key again: waits for the first
    assert np.all(arrays[0].asnumpy() == size * size * (size + 1) / 2)
    kv.synchronize()
