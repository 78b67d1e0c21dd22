"""Training throughput (samples/s) of data-parallel MXNet gluon: netreduce against
MXNet's own parameter server, on the emulated testbed (root), in one run.

    PYTHONPATH=. python benchmarks/train.py --framework mxnet --testbed   # N=4, AlexNet

Modes (the same gluon model, batch, optimizer and steps):
  nr-kv            gluon.Trainer(kvstore="netreduce"): sums, step(global batch)
  nr-hvd           netreduce.mxnet.DistributedTrainer: averages, step(local batch)
  dist_sync        gluon.Trainer(kvstore="dist_sync"), ps-lite started as MXNet's
                   launcher (tools/launch.py -n N -s N) starts it: a scheduler on
                   host 0, one server and one worker on every host, roles and
                   addresses in DMLC_* variables
  dist_sync-1srv   the same with one server, in the aggregator's namespace (the link
                   N x rate that netreduce's aggregator has)

Workers run with the python of MXNet's venv (scripts/env_mxnet.sh; mxnet 1.9.1 needs
numpy < 1.24), one per testbed host namespace; the driver (this environment, root)
builds the testbed, starts the aggregator or the ps-lite processes, and reads rank 0's
RESULT line. The model is the AlexNet layout of benchmarks/train.py (61.1 M
parameters, 244 MB of float32 gradients a step), 64x64 synthetic images.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ["nr-kv", "nr-hvd", "dist_sync", "dist_sync-1srv"]
OUT = os.path.join(HERE, "results", "train_mxnet_testbed")


def venv_python() -> str:
    sys.path.insert(0, ROOT)
    from tests.parallel.mxnet_env import PYTHON
    return PYTHON


# --- one worker (MXNet's venv) -----------------------------------------------------------
def build_alexnet():
    from mxnet import gluon
    nn = gluon.nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(64, 11, 4, 2, activation="relu"), nn.MaxPool2D(3, 2),
            nn.Conv2D(192, 5, padding=2, activation="relu"), nn.MaxPool2D(3, 2),
            nn.Conv2D(384, 3, padding=1, activation="relu"),
            nn.Conv2D(256, 3, padding=1, activation="relu"),
            nn.Conv2D(256, 3, padding=1, activation="relu"), nn.MaxPool2D(3, 2),
            # torchvision's AdaptiveAvgPool2d((6, 6)): 256 x 6 x 6 = 9216 features
            nn.HybridLambda(lambda F, x: F.contrib.AdaptiveAvgPooling2D(x, output_size=6)),
            nn.Flatten(), nn.Dropout(0.5), nn.Dense(4096, activation="relu"),
            nn.Dropout(0.5), nn.Dense(4096, activation="relu"), nn.Dense(1000))
    return net


def worker(args: argparse.Namespace) -> None:
    import mxnet as mx
    from mxnet import autograd, gluon

    mode = args.mode
    opt = {"learning_rate": 0.01, "momentum": 0.9}
    mx.random.seed(0)  # every rank builds the same weights (the stores also sync them)
    net = build_alexnet()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    # Finish deferred initialisation in training mode: an inference-mode forward lets
    # MKLDNN keep conv weights in its own layout, and the wheel's dist_sync servers
    # then abort at the first step ("init K first"; netreduce reorders, buffers.py).
    with autograd.record():
        net(mx.nd.zeros((1, 3, 64, 64)))
    params = net.collect_params()
    if mode == "nr-hvd":
        import netreduce.mxnet as hvd
        hvd.init()
        rank, size, barrier = hvd.rank(), hvd.size(), hvd.barrier
        trainer = hvd.DistributedTrainer(params, "sgd", opt)
        step_batch = args.batch_size
    else:
        if mode == "nr-kv":
            import netreduce.mxnet as nrmx  # registers kvstore="netreduce"
            kv = mx.kv.create("netreduce")
            barrier = nrmx.barrier
        else:
            kv = mx.kv.create("dist_sync")
            barrier = kv._barrier
        rank, size = kv.rank, kv.num_workers
        trainer = gluon.Trainer(params, "sgd", opt, kvstore=kv)
        step_batch = args.batch_size * size  # both stores sum over workers
    rng = __import__("numpy").random.RandomState(rank)
    x = mx.nd.array(rng.randn(args.batch_size, 3, 64, 64))
    y = mx.nd.array(rng.randint(0, 1000, args.batch_size))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step() -> None:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(step_batch)

    # Every worker connected before the first step (the Trainer initialises its store
    # there); ps-lite servers under load otherwise sometimes see a pull before the init.
    barrier()
    for _ in range(args.warmup):
        step()
    mx.nd.waitall()
    barrier()
    ifname = os.environ.get("NRBENCH_IFNAME")
    sys.path.insert(0, HERE)
    import common
    wire0 = common.wire_counters(ifname) if rank == 0 else None
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    mx.nd.waitall()  # the last update, not just its enqueueing
    barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        n_params = sum(int(p.data().size) for p in params.values())
        result = {"mode": mode, "model": "alexnet", "ranks": size, "batch": args.batch_size,
                  "steps": args.steps, "seconds": elapsed, "params": n_params,
                  "samples_per_s": size * args.batch_size * args.steps / elapsed}
        wire1 = common.wire_counters(ifname)
        if wire0 and wire1:
            result["wire_tx_per_step"] = (wire1["tx"] - wire0["tx"]) / args.steps
            result["wire_rx_per_step"] = (wire1["rx"] - wire0["rx"]) / args.steps
        print("RESULT " + json.dumps(result), flush=True)


# --- driver (main environment, root) --------------------------------------------------------


def _wait_workers(procs, helpers, timeout: float, what: str, logdir: str) -> None:
    """Until every worker exits 0; fails at once when a worker fails or a ps-lite
    scheduler/server dies (its workers would wait for it forever)."""
    import common
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                raise RuntimeError(f"{what}: worker(s) {bad} exited with "
                                   f"{[codes[i] for i in bad]}")
            if all(c == 0 for c in codes):
                return
            dead = [i for i, h in enumerate(helpers) if h.poll() not in (None, 0)]
            if dead:
                logs = sorted(f for f in os.listdir(logdir) if not f.startswith("worker"))
                why = " | ".join(common.log_tail(os.path.join(logdir, f), 4, 400) for f in logs)
                raise RuntimeError(f"{what}: ps-lite process(es) {dead} died: {why[-300:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not finished within {timeout:.0f} s")
            time.sleep(0.2)
    finally:
        common.stop(procs, 0, terminate=False)


def start_ps_lite(tb, python: str, base: Dict[str, str], per_rank: List[Dict[str, str]],
                  servers: List, logdir: str) -> List[subprocess.Popen]:
    """dist_sync's processes as MXNet's launcher (tools/launch.py -n N -s S) starts
    them: a scheduler on host 0 and a server on each of ``servers`` (testbed nodes),
    started now with the DMLC_* variables this adds to ``base``; ``per_rank[r]`` gets
    worker r's role and address. `import mxnet` with DMLC_ROLE=scheduler/server runs
    that role and exits when the workers finish. Returns the processes (logs in
    ``logdir``)."""
    import allreduce_launch as launch
    base.update(DMLC_PS_ROOT_URI=tb.hosts[0].address, DMLC_PS_ROOT_PORT=str(launch.free_port()),
                DMLC_NUM_WORKER=str(len(per_rank)), DMLC_NUM_SERVER=str(len(servers)),
                DMLC_INTERFACE=tb.ifname)
    helpers = []
    roles = [("scheduler", tb.hosts[0])] + [("server", s) for s in servers]
    for i, (role, node) in enumerate(roles):
        env = launch.worker_env(dict(base, DMLC_ROLE=role, DMLC_NODE_HOST=node.address))
        with open(os.path.join(logdir, f"{role}{i}.log"), "w") as log:
            helpers.append(tb.popen(node, [python, "-c", "import mxnet"], env=env, cwd=ROOT,
                                    stdout=log, stderr=subprocess.STDOUT))
    for r, rank_env in enumerate(per_rank):
        rank_env.update(DMLC_ROLE="worker", DMLC_NODE_HOST=tb.hosts[r].address)
    return helpers


def run_one(tb, mode: str, args: argparse.Namespace) -> Dict:
    sys.path.insert(0, HERE)
    import allreduce_launch as launch
    import common

    n = len(tb.hosts)
    python = venv_python()
    record: Dict = {"mode": mode, "model": "alexnet", "ranks": n}
    tmp = tempfile.mkdtemp(prefix=f"nrmx-{mode}-")
    me = [python, os.path.abspath(__file__), "--worker", "--mode", mode,
          "--batch-size", str(args.batch_size), "--steps", str(args.steps),
          "--warmup", str(args.warmup)]
    base = {"OMP_NUM_THREADS": str(args.threads), "MXNET_CPU_WORKER_NTHREADS": "1",
            "NRBENCH_IFNAME": tb.ifname, "PYTHONUNBUFFERED": "1"}
    cleanup: List = []
    helpers: List[subprocess.Popen] = []  # ps-lite scheduler and servers
    logs = [os.path.join(tmp, f"worker{r}.log") for r in range(n)]
    try:
        per_rank: List[Dict[str, str]] = [{} for _ in range(n)]
        if mode.startswith("nr-"):
            sw = tb.spawn_switch()
            cleanup.append(sw.stop)
            base.update(NETREDUCE_SWITCH=f"{sw.address[0]}:{sw.address[1]}",
                        NETREDUCE_JOB=f"mx-{uuid.uuid4().hex[:8]}", NETREDUCE_SIZE=str(n),
                        NETREDUCE_LOCAL_SIZE="1")
            for r in range(n):
                per_rank[r].update(NETREDUCE_RANK=str(r), NETREDUCE_LOCAL_RANK="0")
        else:
            servers = [tb.aggregator] if mode == "dist_sync-1srv" else list(tb.hosts)
            helpers += start_ps_lite(tb, python, base, per_rank, servers, tmp)
        procs = []
        for r in range(n):
            env = launch.worker_env(dict(base, **per_rank[r]))
            with open(logs[r], "w") as log:
                procs.append(tb.popen(r, me, env=env, cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT))
        t0 = time.monotonic()
        try:
            _wait_workers(procs, helpers, args.timeout, f"{mode} N={n}", tmp)
        except RuntimeError as exc:
            return dict(record, error=f"{exc}: worker 0: {common.log_tail(logs[0], 4, 400)}")
        record["wall_s"] = time.monotonic() - t0
        for path in logs:  # ps-lite numbers its workers itself: any log may hold rank 0
            with open(path, errors="replace") as f:
                for line in f:
                    if "RESULT " in line:
                        return dict(record, **json.loads(line.split("RESULT ", 1)[1]))
        return dict(record, error=f"no RESULT line: worker 0: {common.log_tail(logs[0], 4, 400)}")
    finally:
        common.stop(helpers, terminate=False)
        common.run_cleanups(cleanup)
        shutil.rmtree(tmp, ignore_errors=True)


def _median(values: List[float]) -> float:
    values = sorted(values)
    k = len(values) // 2
    return values[k] if len(values) % 2 else (values[k - 1] + values[k]) / 2


def markdown(meta: Dict, records: List[Dict]) -> str:
    rates = {}
    for mode in meta["modes"]:
        ok = [r["samples_per_s"] for r in records if r["mode"] == mode and "error" not in r]
        if ok:
            rates[mode] = _median(ok)
    lines = [
        "# MXNet training throughput on the emulated testbed: netreduce vs dist_sync", "",
        f"- date: {meta['date']}; command: `{meta['command']}`",
        f"- machine: {meta['machine'].get('cpu')} x{meta['machine'].get('cores')} cores; load "
        f"average at start {meta['load_start']}, at end {meta['load_end']} (2 cores shared "
        "with other work)",
        f"- testbed: {meta['ranks']} host namespaces + aggregator namespace, host links "
        f"{meta['rate']} each way, aggregator link {meta['ranks']} x that; mxnet 1.9.1, "
        f"AlexNet-like gluon model, batch {meta['batch']} per rank, SGD momentum 0.9, "
        f"{meta['warmup']} warm-up + {meta['steps']} timed steps, {meta['repeat']} run(s) "
        "per mode, interleaved", "",
        "| mode | run | samples/s | s/step | wire tx/S | wire rx/S |", "|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r.get('run', 0)} | failed: {r['error'][:200]} | | | |")
            continue
        s = 4 * r["params"]
        lines.append(f"| {r['mode']} | {r.get('run', 0)} | {r['samples_per_s']:.2f} | "
                     f"{r['seconds'] / r['steps']:.2f} | "
                     + (f"{r['wire_tx_per_step'] / s:.3f} | {r['wire_rx_per_step'] / s:.3f} |"
                        if "wire_tx_per_step" in r else "- | - |"))
    lines += ["", "Median samples/s: " + ", ".join(f"{m} {v:.2f}" for m, v in rates.items()),
              "", "Speed-ups (ratio of the medians):", ""]
    for nr in ("nr-kv", "nr-hvd"):
        for base in ("dist_sync", "dist_sync-1srv"):
            if nr in rates and base in rates:
                lines.append(f"- {nr} / {base}: {rates[nr] / rates[base]:.2f}x")
    lines += ["", "Raw records:", "", "```"] + [json.dumps(r) for r in records] + ["```", ""]
    return "\n".join(lines)


def testbed_main(args: argparse.Namespace) -> int:
    sys.path.insert(0, HERE)
    import common
    from netreduce.testbed import Testbed, why_unusable

    reason = why_unusable()
    if reason:
        print(f"train.py --framework mxnet --testbed: {reason}", file=sys.stderr)
        return 2
    if not os.access(venv_python(), os.X_OK):
        print(f"no MXNet venv at {venv_python()}: run bash scripts/env_mxnet.sh", file=sys.stderr)
        return 2
    meta = {"date": common.utc_now(), "command": common.command_line(),
            "machine": common.machine_description(), "ranks": args.ranks, "rate": args.rate,
            "batch": args.batch_size, "steps": args.steps, "warmup": args.warmup,
            "repeat": args.repeat, "modes": args.modes,
            "load_start": "/".join(f"{x:.2f}" for x in os.getloadavg())}
    records = []
    with Testbed(hosts=args.ranks, rate=args.rate, name=args.testbed_name, subnet=args.subnet,
                 replace=True) as tb:
        print("# " + tb.describe().replace("\n", "\n# "), flush=True)
        for run, mode in [(k, m) for k in range(args.repeat) for m in args.modes]:
            for attempt in range(1 + args.retries):
                r = dict(run_one(tb, mode, args), run=run, attempt=attempt)
                records.append(r)
                if "error" not in r:
                    break
                print(f"{mode:15} attempt {attempt} FAILED {r['error']}", flush=True)
            print(f"{mode:15} " + (f"FAILED {r['error']}" if "error" in r else
                                   f"{r['samples_per_s']:8.2f} samples/s  "
                                   f"{r['seconds'] / r['steps']:6.2f} s/step"), flush=True)
    meta["load_end"] = "/".join(f"{x:.2f}" for x in os.getloadavg())
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(markdown(meta, records))
        print(f"wrote {args.out}")
    done = {r["mode"] for r in records if "error" not in r}
    return 0 if done == set(args.modes) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--testbed", action="store_true", help="required: runs on the testbed (root)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--modes", default=",".join(MODES), help=f"any of {','.join(MODES)}")
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per worker")
    p.add_argument("--rate", default="300mbit", help="each host link's rate each way")
    p.add_argument("--timeout", type=int, default=600, help="seconds per mode")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of every mode, interleaved (median reported)")
    p.add_argument("--retries", type=int, default=2,
                   help="re-runs of a failed mode (ps-lite's servers sometimes abort on a "
                        "loaded host: 'init K first')")
    p.add_argument("--testbed-name", default="nrmxtrain")
    p.add_argument("--subnet", default="10.83.0.0/24")
    p.add_argument("--out", default=OUT + ".md", help="Markdown report ('' = none)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    args.modes = args.modes.split(",")
    for mode in args.modes:
        if mode not in MODES:
            p.error(f"unknown mode {mode!r}")
    if not args.testbed:
        p.error("the MXNet comparison runs on the emulated testbed: add --testbed (root)")
    return testbed_main(args)


if __name__ == "__main__":
    sys.exit(main())
