"""The ranks of benchmarks/overlap_frameworks.py: one process per testbed host, which
trains the AlexNet step of its mode (Keras: nr-hvd, nr-strategy, tf-mwms; MXNet:
nr-kv, nr-hvd, dist_sync; both: compute, F, B and U timed on their own) and prints
rank 0's result as one ``RESULT {json}`` line: the timed steps' stamps, its CPU per
thread (thread_cpu.py), the engine's waits, the wire bytes. The driver starts them as
``overlap_frameworks.py TARGET --worker --mode MODE ...``."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

from thread_cpu import own_cpu, threads_cpu

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _now_us() -> float:
    return time.time_ns() / 1000.0  # the timeline's clock (netreduce/worker/timeline.py)



def keras_worker(args: argparse.Namespace) -> Dict[str, Any]:
    import tensorflow as tf
    # 1 and 2 unless a variant's environment says otherwise (an A/B of TF's pools)
    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("NRBENCH_TF_INTRA_OP", "1")))
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("NRBENCH_TF_INTER_OP", "2")))
    import numpy as np
    from train_tensorflow import build_model, start_mode

    mode = args.mode
    strategy, rank, _, barrier = start_mode(mode, int(os.environ.get("NRBENCH_RANK", "0")))
    model, optimizer, loss_fn = build_model(mode, strategy)
    rng = np.random.default_rng(rank)
    x = tf.constant(rng.normal(size=(args.batch_size, 64, 64, 3)).astype("float32"))
    y = tf.constant(rng.integers(0, 1000, args.batch_size))

    def forward(x, y):
        return loss_fn(y, model(x, training=True))

    def grads_of(x, y):
        with tf.GradientTape() as tape:
            loss = forward(x, y)
        return loss, tape.gradient(loss, model.trainable_variables)

    def one_step(x, y):
        loss, grads = grads_of(x, y)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    @tf.function
    def train_step(x, y):
        return one_step(x, y) if strategy is None else strategy.run(one_step, args=(x, y))

    result: Dict[str, Any] = {"params": int(model.count_params()), "rank": rank}
    if mode == "compute":  # F, B, U on their own: three functions, each call synchronous
        fwd = tf.function(forward)
        fwd_bwd = tf.function(lambda x, y: grads_of(x, y)[1])
        for _ in range(args.warmup):
            fwd(x, y), fwd_bwd(x, y), train_step(x, y)
        t = {"f": [], "fb": [], "fbu": []}
        for _ in range(args.steps):
            for key, fn in (("f", fwd), ("fb", fwd_bwd), ("fbu", train_step)):
                t0 = time.perf_counter()
                out = fn(x, y)
                (out[-1] if isinstance(out, list) else out).numpy()
                t[key].append(time.perf_counter() - t0)
        f, fb, fbu = statistics.median(t["f"]), statistics.median(t["fb"]), statistics.median(t["fbu"])
        cpu_stamps = []  # whole steps back to back: the window of the ranks' CPU per step
        before = threads_cpu()
        for _ in range(args.steps):
            t0 = _now_us()
            train_step(x, y).numpy()
            cpu_stamps.append([t0, _now_us()])
        return dict(result, forward=f, backward=fb - f, update=fbu - fb, step=fbu,
                    samples=t, cpu_stamps=cpu_stamps, own_cpu=own_cpu(before, args.steps))
    for _ in range(args.warmup):
        train_step(x, y)
    barrier()
    stamps = []
    engine0 = _engine_stats()
    before = threads_cpu()
    for _ in range(args.steps):
        t0 = _now_us()
        loss = train_step(x, y)
        np.asarray(strategy.experimental_local_results(loss)[0] if strategy else loss)
        stamps.append([t0, _now_us()])
    own = own_cpu(before, args.steps)
    engine1 = _engine_stats()
    barrier()
    if engine0 and engine1:  # the engine's waits and naps per step (its Stats counters)
        own["engine_per_step"] = {k: round((engine1[k] - engine0.get(k, 0)) / args.steps, 1)
                                  for k in ("waits", "naps", "nap_us", "nap_offs", "packets_received")
                                  if k in engine1}
    return dict(result, stamps=stamps, own_cpu=own)


def _engine_stats() -> Dict[str, int]:
    """This rank's engine counters (the data plane's stats), {} without netreduce."""
    try:
        import netreduce as _nr
        return dict(_nr.api._communicator().dp.stats()) if _nr.is_initialized() else {}
    except Exception:  # a mode without a netreduce data plane, or one without stats
        return {}


def _adapter_from(tree: str) -> None:
    """netreduce and netreduce.mxnet from checkout ``tree`` (built in place), whatever
    checkout MXNet's venv has installed editable: only installing maps frameworks/mxnet
    to netreduce.mxnet, so a finder first on sys.meta_path does it here."""
    import importlib.util
    sys.path.insert(0, tree)
    adapter = os.path.join(tree, "frameworks", "mxnet")

    class _Adapter:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname != "netreduce.mxnet" and not fullname.startswith("netreduce.mxnet."):
                return None
            where = os.path.join(adapter, *fullname.split(".")[2:])
            if os.path.isdir(where):
                return importlib.util.spec_from_file_location(
                    fullname, os.path.join(where, "__init__.py"),
                    submodule_search_locations=[where])
            return importlib.util.spec_from_file_location(fullname, where + ".py")
    sys.meta_path.insert(0, _Adapter)


def mxnet_worker(args: argparse.Namespace) -> Dict[str, Any]:
    _adapter_from(os.environ.get("NRBENCH_TREE") or ROOT)
    import mxnet as mx
    from mxnet import autograd, gluon
    from train_mxnet import build_alexnet

    mode = args.mode
    opt = {"learning_rate": 0.01, "momentum": 0.9}
    mx.random.seed(0)
    net = build_alexnet()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    with autograd.record():  # train_mxnet.py: deferred init in training mode
        net(mx.nd.zeros((1, 3, 64, 64)))
    params = net.collect_params()
    rank, barrier, step_batch = int(os.environ.get("NRBENCH_RANK", "0")), None, args.batch_size
    if mode == "nr-hvd":
        import netreduce.mxnet as hvd
        hvd.init()
        rank, barrier = hvd.rank(), hvd.barrier
        trainer = hvd.DistributedTrainer(params, "sgd", opt)
    elif mode == "compute":
        trainer = gluon.Trainer(params, "sgd", opt, kvstore=None)
    else:
        if mode == "nr-kv":
            import netreduce.mxnet as nrmx
            kv, barrier = mx.kv.create("netreduce"), nrmx.barrier
        else:
            kv = mx.kv.create("dist_sync")
            barrier = kv._barrier
        rank = kv.rank
        trainer = gluon.Trainer(params, "sgd", opt, kvstore=kv)
        step_batch = args.batch_size * kv.num_workers  # both stores sum
    rng = __import__("numpy").random.RandomState(rank)
    x = mx.nd.array(rng.randn(args.batch_size, 3, 64, 64))
    y = mx.nd.array(rng.randint(0, 1000, args.batch_size))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    n_params = sum(int(p.data().size) for p in params.values())
    result: Dict[str, Any] = {"params": n_params, "rank": rank}

    def step(t: Optional[Dict[str, List[float]]] = None) -> None:
        t0 = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        if t is not None:
            loss.wait_to_read()
            t1 = time.perf_counter()
        loss.backward()
        if t is not None:
            mx.nd.waitall()
            t2 = time.perf_counter()
        trainer.step(step_batch)
        mx.nd.waitall()
        if t is not None:
            t3 = time.perf_counter()
            t["forward"].append(t1 - t0)
            t["backward"].append(t2 - t1)
            t["update"].append(t3 - t2)
            t["step"].append(t3 - t0)

    if barrier:
        barrier()
    for _ in range(args.warmup):
        step()
    if mode == "compute":
        t: Dict[str, List[float]] = {"forward": [], "backward": [], "update": [], "step": []}
        cpu_stamps = []
        for _ in range(args.steps):
            t0 = _now_us()
            step(t)
            cpu_stamps.append([t0, _now_us()])
        return dict(result, samples=t, cpu_stamps=cpu_stamps, **{k: statistics.median(v) for k, v in t.items()})
    barrier()
    stamps = []
    for _ in range(args.steps):
        t0 = _now_us()
        step()
        stamps.append([t0, _now_us()])
    barrier()
    return dict(result, stamps=stamps)


def worker(args: argparse.Namespace) -> None:
    ifname = os.environ.get("NRBENCH_IFNAME")
    import common
    wire0 = common.wire_counters(ifname)
    cpu0 = common.self_cpu_seconds()
    result = (keras_worker if args.target == "keras" else mxnet_worker)(args)
    result["cpu_s"] = common.self_cpu_seconds() - cpu0
    wire1 = common.wire_counters(ifname)
    if wire0 and wire1:
        result["wire_tx"] = wire1["tx"] - wire0["tx"]
        result["wire_rx"] = wire1["rx"] - wire0["rx"]
    if result.get("rank", 0) == 0:
        print("RESULT " + json.dumps(result), flush=True)

