"""Training throughput (samples/s) of data-parallel TensorFlow/Keras 3: netreduce (both
of its paths) against TensorFlow's own MultiWorkerMirroredStrategy, on the emulated
testbed (root), in one run.

    PYTHONPATH=. python benchmarks/train.py --framework tensorflow --testbed   # N=4
    PYTHONPATH=. python benchmarks/train.py --framework tensorflow --testbed \
        --modes nr-hvd --steps 1 --warmup 0 --out '' --json ''            # smoke run

Modes (the same Keras model, per-rank batch, optimizer and tf.function train step:
GradientTape, then the Keras optimizer's apply):
  nr-hvd       netreduce.tensorflow.keras.DistributedOptimizer (the Horovod way)
  nr-strategy  netreduce.tensorflow.Strategy() scope (tf.distribute, through netreduce)
  tf-mwms      tf.distribute.MultiWorkerMirroredStrategy with
               CommunicationImplementation.RING, TF_CONFIG naming every testbed host

The model is the AlexNet layout of benchmarks/train.py in Keras (61.1 M parameters,
244 MB of float32 gradients a step; 95 % in the dense layers): communication-bound on
the testbed's 300 Mbit/s host links. One rank per emulated host (network namespace),
started directly in it; the netreduce modes get a netreduce-switch in the aggregator's
namespace, whose link carries N x rate. Rank 0 prints a RESULT line.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ["nr-hvd", "nr-strategy", "tf-mwms"]
OUT = os.path.join(HERE, "results", "train_tensorflow_testbed")
MWMS_PORT = 23456  # every worker in its own namespace: one port for all


# --- one worker ---------------------------------------------------------------------------
def build_alexnet():
    """torchvision's AlexNet layout for 64x64 inputs (benchmarks/train.py): after the
    features the map is 1x1x256, and AdaptiveAvgPool2d((6, 6)) repeats it to 6x6."""
    import keras
    L = keras.layers
    return keras.Sequential([
        keras.Input((64, 64, 3)),
        L.ZeroPadding2D(2), L.Conv2D(64, 11, 4, activation="relu"), L.MaxPooling2D(3, 2),
        L.ZeroPadding2D(2), L.Conv2D(192, 5, activation="relu"), L.MaxPooling2D(3, 2),
        L.Conv2D(384, 3, padding="same", activation="relu"),
        L.Conv2D(256, 3, padding="same", activation="relu"),
        L.Conv2D(256, 3, padding="same", activation="relu"), L.MaxPooling2D(3, 2),
        L.UpSampling2D(6), L.Flatten(), L.Dropout(0.5), L.Dense(4096, activation="relu"),
        L.Dropout(0.5), L.Dense(4096, activation="relu"), L.Dense(1000)])


def start_mode(mode: str, rank: int):
    """Start the job's side of `mode` before any other TensorFlow op runs: tf-mwms's
    MultiWorkerMirroredStrategy (RING), or netreduce.tensorflow for the nr-* modes.
    Returns (strategy or None, rank, size, barrier); other modes run alone as `rank`."""
    import tensorflow as tf
    if mode == "tf-mwms":
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

        def barrier():  # a collective every worker must join
            strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        return strategy, strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync, barrier
    if mode.startswith("nr-"):
        import netreduce.tensorflow as nrtf
        nrtf.init()
        strategy = nrtf.Strategy() if mode == "nr-strategy" else None
        return strategy, nrtf.rank(), nrtf.size(), nrtf.barrier
    return None, rank, 1, lambda: None


def build_model(mode: str, strategy):
    """AlexNet and momentum SGD with the same initial weights on every rank, built in the
    strategy's scope; the optimizer is netreduce's DistributedOptimizer for nr-hvd.
    Returns (model, optimizer, loss_fn)."""
    import keras
    keras.utils.set_random_seed(0)  # the same initial weights on every rank
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = build_alexnet()
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        if mode == "nr-hvd":
            import netreduce.tensorflow.keras as hvd
            optimizer = hvd.DistributedOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    return model, optimizer, loss_fn


def worker(args: argparse.Namespace) -> None:
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    mode = args.mode
    strategy, rank, size, barrier = start_mode(mode, rank=0)
    import numpy as np

    model, optimizer, loss_fn = build_model(mode, strategy)
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    rng = np.random.default_rng(rank)
    images = tf.constant(rng.normal(size=(args.batch_size, 64, 64, 3)).astype("float32"))
    labels = tf.constant(rng.integers(0, 1000, args.batch_size))

    # One custom train step for every mode: Keras 3.15's own train function (fit,
    # train_on_batch) fails under a multi-worker MultiWorkerMirroredStrategy
    # (reduce_per_replica calls strategy.reduce("MEAN", v, axis=0) on its scalar logs).
    def one_step(x, y):
        with tf.GradientTape() as tape:
            # under a strategy a Keras loss is already divided by num_replicas_in_sync
            # (the strategies then sum the gradients over the replicas)
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    @tf.function
    def train_step(x, y):
        if strategy is None:
            return one_step(x, y)
        return strategy.run(one_step, args=(x, y))

    for _ in range(args.warmup):
        train_step(images, labels)
    barrier()
    ifname = os.environ.get("NRBENCH_IFNAME")
    probe = None
    if rank == 0 and ifname:
        sys.path.insert(0, HERE)
        import common
        probe = (common.wire_counters(ifname), common.machine_cpu(), common.self_cpu_seconds())
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = train_step(images, labels)
    barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        result = {"mode": mode, "model": "alexnet", "ranks": size, "batch": args.batch_size,
                  "steps": args.steps, "seconds": elapsed, "params": model.count_params(),
                  "samples_per_s": size * args.batch_size * args.steps / elapsed,
                  "loss": replicas * float(np.asarray(
                      strategy.experimental_local_results(loss)[0] if strategy else loss))}
        if probe is not None:
            wire0, mach0, cpu0 = probe
            wire1 = common.wire_counters(ifname)
            result["cpu_rank0"] = (common.self_cpu_seconds() - cpu0) / elapsed
            result["machine_busy"] = common.machine_busy_fraction(mach0, common.machine_cpu())
            if wire0 and wire1:
                result["wire_tx_per_step"] = (wire1["tx"] - wire0["tx"]) / args.steps
                result["wire_rx_per_step"] = (wire1["rx"] - wire0["rx"]) / args.steps
        print("RESULT " + json.dumps(result), flush=True)


# --- driver (root, this environment) --------------------------------------------------------


def run_one(tb, mode: str, args: argparse.Namespace) -> Dict:
    sys.path.insert(0, HERE)
    import allreduce_launch as launch  # wait_all, worker_env
    import common

    n = len(tb.hosts)
    record = {"mode": mode, "model": "alexnet", "ranks": n}
    tmp = tempfile.mkdtemp(prefix=f"nrtftrain-{mode}-")
    me = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode,
          "--batch-size", str(args.batch_size), "--steps", str(args.steps),
          "--warmup", str(args.warmup), "--threads", str(args.threads)]
    common_env = {"OMP_NUM_THREADS": str(args.threads), "NRBENCH_IFNAME": tb.ifname,
                  "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    per_rank: List[Dict[str, str]] = [{} for _ in range(n)]
    cleanup = []
    logs = [os.path.join(tmp, f"rank{r}.log") for r in range(n)]
    try:
        if mode.startswith("nr-"):
            sw = tb.spawn_switch(args=shlex.split(args.switch_args))
            cleanup.append(sw.stop)
            common_env.update(NETREDUCE_SWITCH=f"{sw.address[0]}:{sw.address[1]}",
                              NETREDUCE_JOB=f"tftrain-{uuid.uuid4().hex[:8]}",
                              NETREDUCE_SIZE=str(n), NETREDUCE_LOCAL_SIZE="1")
            for r in range(n):
                per_rank[r].update(NETREDUCE_RANK=str(r), NETREDUCE_LOCAL_RANK="0")
        else:  # TF's own cluster description, one worker per testbed host
            cluster = {"worker": [f"{h.address}:{MWMS_PORT}" for h in tb.hosts]}
            for r in range(n):
                per_rank[r]["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": r}})
        procs = []
        for r in range(n):
            env = launch.worker_env(dict(common_env, **per_rank[r]))
            for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                          "grpc_proxy", "all_proxy", "ALL_PROXY"):
                env.pop(proxy, None)  # gRPC would route the workers' traffic through it
            with open(logs[r], "w") as log:
                procs.append(tb.popen(r, me, env=env, cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT))
        t0 = time.monotonic()
        try:
            launch.wait_all(procs, args.timeout, f"{mode} N={n}")
        except RuntimeError as exc:
            bad = [r for r, proc in enumerate(procs) if proc.returncode not in (None, 0)]
            first = bad[0] if bad else 0
            return dict(record, error=f"{exc}: rank {first}: {common.log_tail(logs[first], 12, 2000)}")
        record["wall_s"] = time.monotonic() - t0
        with open(logs[0], errors="replace") as f:
            for line in f:
                if "RESULT " in line:
                    return dict(record, **json.loads(line.split("RESULT ", 1)[1]))
        return dict(record, error=f"no RESULT from rank 0: {common.log_tail(logs[0])}")
    finally:
        common.run_cleanups(cleanup)
        shutil.rmtree(tmp, ignore_errors=True)


def markdown(meta: Dict, records: List[Dict]) -> str:
    base = next((r for r in records if r["mode"] == "tf-mwms" and "error" not in r), None)
    out = [f"# Keras AlexNet-like training on the testbed, N = {meta['ranks']}", "",
           f"`{meta['command']}` — {meta['date']}, {meta['rate']} per host link each way, "
           f"per-rank batch {meta['batch']}, {meta['warmup']} warm-up + {meta['steps']} "
           f"timed steps; TensorFlow {meta.get('tensorflow')}, Keras {meta.get('keras')}. "
           f"Load average at start {meta['loadavg_at_start'][0]:.2f}, at end "
           f"{meta['loadavg_at_end'][0]:.2f} (2 shared cores).", "",
           "| mode | samples/s | s/step | tx per step / gradient bytes | machine busy | "
           "vs tf-mwms |", "|---|---:|---:|---:|---:|---:|"]
    for r in records:
        if "error" in r:
            out.append(f"| {r['mode']} | failed: {r['error'][:200]} | | | | |")
            continue
        tx = r.get("wire_tx_per_step", 0) / (4 * r["params"])
        ratio = f"{r['samples_per_s'] / base['samples_per_s']:.2f}x" if base else "-"
        out.append(f"| {r['mode']} | {r['samples_per_s']:.2f} | {r['seconds'] / r['steps']:.2f} "
                   f"| {tx:.3f} | {r.get('machine_busy', 0):.0%} | {ratio} |")
    return "\n".join(out) + "\n"


def testbed_main(args: argparse.Namespace) -> int:
    from netreduce.testbed import Testbed, why_unusable

    sys.path.insert(0, HERE)
    import common

    reason = why_unusable()
    if reason:
        print(f"train.py --framework tensorflow --testbed: {reason}", file=sys.stderr)
        return 2
    import keras
    import tensorflow as tf
    meta = {"date": common.utc_now(), "command": common.command_line(),
            "machine": common.machine_description(), "loadavg_at_start": os.getloadavg(),
            "rate": args.rate, "ranks": args.ranks, "batch": args.batch_size,
            "steps": args.steps, "warmup": args.warmup, "modes": args.modes,
            "tensorflow": tf.__version__, "keras": keras.__version__}
    records = []
    with Testbed(hosts=args.ranks, rate=args.rate, name=args.testbed_name,
                 subnet=args.subnet, replace=True) as tb:
        print("# " + tb.describe().replace("\n", "\n# "), flush=True)
        for mode in args.modes:
            r = run_one(tb, mode, args)
            records.append(r)
            if "error" in r:
                print(f"{mode:12} FAILED {r['error']}", flush=True)
            else:
                print(f"{mode:12} {r['samples_per_s']:8.2f} samples/s "
                      f"{r['seconds'] / r['steps']:6.2f} s/step ({r['wall_s']:.0f} s)", flush=True)
    meta["loadavg_at_end"] = os.getloadavg()
    text = markdown(meta, records)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        common.write_json(args.json, meta, records)
    return 0 if all("error" not in r for r in records) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", default="tensorflow", choices=["tensorflow"])
    p.add_argument("--testbed", action="store_true", help="required: the emulated testbed (root)")
    p.add_argument("--modes", default=",".join(MODES), help=f"any of {','.join(MODES)}")
    p.add_argument("--ranks", default="4", help="world size (one testbed host each)")
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps")
    p.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op threads per rank")
    p.add_argument("--timeout", type=int, default=900, help="seconds per mode")
    p.add_argument("--rate", default="300mbit", help="each host link's rate each way (tc syntax)")
    p.add_argument("--testbed-name", default="nrtftrain")
    p.add_argument("--subnet", default="10.81.0.0/24")
    p.add_argument("--switch-args", default="", help="extra netreduce-switch options")
    p.add_argument("--out", default=OUT + ".md", help="Markdown report ('' = none)")
    p.add_argument("--json", default=OUT + ".json", help="records as JSON ('' = none)")
    p.add_argument("--models", default="alexnet", help="only alexnet")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args, _ = p.parse_known_args(argv)
    if args.worker:
        worker(args)
        return 0
    if not args.testbed:
        p.error("--framework tensorflow runs on the emulated testbed only: add --testbed")
    args.ranks = int(args.ranks)
    args.modes = args.modes.split(",")
    for mode in args.modes:
        if mode not in MODES:
            p.error(f"unknown mode {mode!r}")
    return testbed_main(args)


if __name__ == "__main__":
    sys.exit(main())
