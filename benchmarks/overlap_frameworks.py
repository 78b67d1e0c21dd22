#!/usr/bin/env python3
"""Issue 33's first target for Keras and MXNet: each netreduce path's training step
against its overlap bound, beside the framework's own strategy, in one run.

    # as root (the testbed): N=4 ranks one per host at 1 Gbit/s, MTU 9000
    python3 benchmarks/overlap_frameworks.py keras --runs 5   # nr-hvd, tf-mwms, compute
    python3 benchmarks/overlap_frameworks.py mxnet --runs 5   # nr-kv, dist_sync, compute

The model is the one benchmarks/train_tensorflow.py and train_mxnet.py train (their
``build_alexnet``: torchvision's AlexNet layout, 61.1 M parameters, S = 244.4 MB of
float32 gradients, 95 % of it in the dense layers that backward reaches first),
64x64 synthetic images, per-rank batch 8, SGD with momentum. Modes, each run all of
them in an order rotated from run to run (paired alternation):

    keras  nr-hvd     netreduce.tensorflow.keras.DistributedOptimizer, tf.function step
           nr-strategy  netreduce.tensorflow.Strategy() (optional)
           tf-mwms    MultiWorkerMirroredStrategy, CommunicationImplementation.RING
    mxnet  nr-kv      gluon.Trainer(kvstore="netreduce")
           nr-hvd     netreduce.mxnet.DistributedTrainer (optional)
           dist_sync  gluon.Trainer(kvstore="dist_sync"), a ps-lite server per host
    both   compute    the same 4 processes at once, no communication: forward F,
                      backward B and update U, each timed on its own (synchronised)

The bound of a step: F + max(B, S/R) + U (R the link rate), F/B/U from the compute
mode of the same run; a path meets issue 33's target when its step <= 1.1 x bound.
The step is the median of the timed steps' wall time on rank 0 (each step ends when
its update has run: a tf.function call returns, MXNet's waitall). The netreduce modes
write rank 0's NETREDUCE_TIMELINE; per step it gives when the gradients reached the
core (first and last ``ready``), each fusion message's start and end, the link's idle
time between messages, and the wait from the last message's end to the step's end.
The record (benchmarks/results/issue33/overlap_{keras,mxnet}_UTC.json) keeps every
run with its load average; the summary is medians with (min, max).

Each mode also records the whole machine's CPU over rank 0's timed steps (``machine_cpu``,
overlap_step.py's: busy fraction, every rank process's and the aggregator's CPU-seconds
per step; the compute mode's over whole steps run back to back after its F/B/U
timings). ``--floor`` adds a part to each run's rotation, the paced do-nothing floor
of benchmarks/cpu_bounds.py on the same testbed (rounds of ``--floor-bytes``), and
reads every step against the run's CPU floor, step_floor.py's (d): (the compute mode's
ranks' CPU per step + the floor's CPU for the step's S bytes, 4 ranks and the
reflector) / the cores (``cpu_floor_of``; the summary's ``cpu_floor``):

    python3 benchmarks/overlap_frameworks.py keras --runs 5 --steps 3 --warmup 1 \
        --modes nr-hvd,compute,tf-mwms --floor

Paired A/B of two versions of the adapter: ``--code base=DIR`` and a mode ``MODE@base``
run MODE with netreduce (and netreduce.mxnet) from checkout DIR, built in place, in
the same rotation as the others (mxnet; the workers import the adapter from the
checkout they are given, the one this script is in by default):

    python3 benchmarks/overlap_frameworks.py mxnet --runs 5 --code base=/tmp/base \
        --modes nr-kv,nr-kv@base,compute

A mode written MODE%VARIANT (after an @CODE too) runs with the environment
``--env-variant VARIANT:K=V[,K=V]`` gives in every rank's process (overlap_step.py's
notation), in the same rotation: a paired A/B of a setting; each run records its step
over MODE's (``MODE%VARIANT_step_vs_MODE``) and its ranks' CPU over MODE's:

    python3 benchmarks/overlap_frameworks.py keras --runs 5 --modes nr-hvd,nr-hvd%one,compute \
        --env-variant one:NRBENCH_TF_INTER_OP=1
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
OUT = os.path.join(HERE, "results", "issue33")
MODES = {"keras": ("nr-hvd", "tf-mwms", "compute"), "mxnet": ("nr-kv", "dist_sync", "compute")}
OPTIONAL = {"keras": ("nr-strategy",), "mxnet": ("nr-hvd",)}
MWMS_PORT = 23456


def _now_us() -> float:
    return time.time_ns() / 1000.0  # the timeline's clock (netreduce/worker/timeline.py)


def _med(vals: List[float]) -> float:
    return statistics.median(vals)


# --- workers (one per testbed host) ---------------------------------------------------------
def _ctx_switches(tid: int) -> List[int]:
    """Thread ``tid``'s [voluntary, nonvoluntary] context switches so far (its status)."""
    out = [0, 0]
    try:
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    out[0] = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    out[1] = int(line.split()[1])
    except OSError:
        pass  # ended meanwhile
    return out


def _threads_cpu() -> Dict[int, Any]:
    """This process's threads now: {tid: (name, CPU-seconds, [voluntary, nonvoluntary]
    context switches)} (/proc/self/task)."""
    from netreduce.testbed import proc_stat
    return {t.pid: (t.comm, t.cpu_seconds, _ctx_switches(t.pid)) for t in proc_stat.threads("self")}


def _own_cpu(before: Dict[int, Any], steps: int) -> Dict[str, Any]:
    """This process's CPU-seconds per step since ``before`` (``_threads_cpu``): the
    whole process's, and per thread name (TensorFlow's pools name their threads
    alike; netreduce's engine, executor and agreement threads have their own)."""
    names: Dict[str, List[float]] = {}
    switches: Dict[str, List[float]] = {}  # per thread name: [voluntary, nonvoluntary]
    for tid, (name, cpu, ctx) in _threads_cpu().items():
        _, cpu0, ctx0 = before.get(tid, (name, 0.0, [0, 0]))
        names.setdefault(name, []).append(cpu - cpu0)
        acc = switches.setdefault(name, [0.0, 0.0])
        acc[0] += ctx[0] - ctx0[0]
        acc[1] += ctx[1] - ctx0[1]
    per = {n: round(sum(v) / steps, 4) for n, v in names.items() if sum(v) > 0}
    return {"cpu_s_per_step": round(sum(per.values()), 4),
            "threads": {n: len(v) for n, v in names.items()},
            "by_thread_name": dict(sorted(per.items(), key=lambda kv: -kv[1])),
            "ctx_switches_per_step": {n: [round(v / steps, 1), round(nv / steps, 1)]
                                      for n, (v, nv) in switches.items() if v + nv > 0}}


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
        f, fb, fbu = _med(t["f"]), _med(t["fb"]), _med(t["fbu"])
        cpu_stamps = []  # whole steps back to back: the window of the ranks' CPU per step
        before = _threads_cpu()
        for _ in range(args.steps):
            t0 = _now_us()
            train_step(x, y).numpy()
            cpu_stamps.append([t0, _now_us()])
        return dict(result, forward=f, backward=fb - f, update=fbu - fb, step=fbu,
                    samples=t, cpu_stamps=cpu_stamps, own_cpu=_own_cpu(before, args.steps))
    for _ in range(args.warmup):
        train_step(x, y)
    barrier()
    stamps = []
    engine0 = _engine_stats()
    before = _threads_cpu()
    for _ in range(args.steps):
        t0 = _now_us()
        loss = train_step(x, y)
        np.asarray(strategy.experimental_local_results(loss)[0] if strategy else loss)
        stamps.append([t0, _now_us()])
    own = _own_cpu(before, args.steps)
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
        return dict(result, samples=t, cpu_stamps=cpu_stamps, **{k: _med(v) for k, v in t.items()})
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


# --- driver (root, the testbed) -------------------------------------------------------------


def _python(target: str) -> str:
    if target == "mxnet":
        from train_mxnet import venv_python
        return venv_python()
    return sys.executable


def run_mode(tb, label: str, args: argparse.Namespace, tmp: str) -> Dict[str, Any]:
    """One run of mode ``label`` (MODE, or MODE@CODE: the adapter from the checkout
    --code names CODE)."""
    import allreduce_launch as launch
    import common
    from train_mxnet import _wait_workers, start_ps_lite

    import overlap_step
    n = args.np
    mode, code, variant = overlap_step.parse_label(label)
    record: Dict[str, Any] = {"mode": label, "load": list(os.getloadavg())}
    python = _python(args.target)
    timeline = os.path.join(tmp, "timeline.json")
    argv = [python, os.path.abspath(__file__), args.target, "--worker", "--mode", mode,
            "--batch-size", str(args.batch_size), "--steps", str(args.steps),
            "--warmup", str(args.warmup)]
    base = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1", "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2", "NRBENCH_IFNAME": tb.ifname,
            "NRBENCH_TREE": dict(c.split("=", 1) for c in args.code)[code] if code else ROOT}
    if variant:  # every rank's process, whatever the mode
        base.update(args.variants[variant])
    per_rank: List[Dict[str, str]] = [{"NRBENCH_RANK": str(r)} for r in range(n)]
    cleanup, helpers = [], []
    logs = [os.path.join(tmp, f"worker{r}.log") for r in range(n)]
    sampler = common.MachineCPUSampler()  # the whole machine and each rank's process
    try:
        if mode.startswith("nr-"):
            sw = tb.spawn_switch(args=shlex.split(args.switch_args))
            cleanup.append(sw.stop)
            sampler.watch("aggregator", sw.pid)
            base.update(NETREDUCE_SWITCH=f"{sw.address[0]}:{sw.address[1]}",
                        NETREDUCE_JOB=f"ov{args.target}-{uuid.uuid4().hex[:8]}",
                        NETREDUCE_SIZE=str(n), NETREDUCE_LOCAL_SIZE="1")
            if args.timeline:
                base["NETREDUCE_TIMELINE"] = timeline
            for item in args.nr_env:
                key, _, value = item.partition("=")
                base[key] = value
            for r in range(n):
                per_rank[r].update(NETREDUCE_RANK=str(r), NETREDUCE_LOCAL_RANK="0")
        elif mode == "tf-mwms":
            cluster = {"worker": [f"{h.address}:{MWMS_PORT}" for h in tb.hosts]}
            for r in range(n):
                per_rank[r]["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": r}})
        elif mode == "dist_sync":  # a scheduler on host 0, a server per host
            helpers += start_ps_lite(tb, python, base, per_rank, list(tb.hosts), tmp)
        procs = []
        sampler.__enter__()
        cleanup.append(lambda: sampler.__exit__(None))
        for r in range(n):
            env = launch.worker_env(dict(base, **per_rank[r]))
            for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                          "grpc_proxy", "all_proxy", "ALL_PROXY"):
                env.pop(proxy, None)
            with open(logs[r], "w") as log:
                procs.append(tb.popen(r, argv, env=env, cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT))
            sampler.watch("ranks", procs[-1].pid)
        t0 = time.monotonic()
        try:
            _wait_workers(procs, helpers, args.timeout, f"{mode} N={n}", tmp)
        except RuntimeError as exc:
            return dict(record, error=f"{exc}: worker 0: {common.log_tail(logs[0])}")
        record["wall_s"] = round(time.monotonic() - t0, 1)
    finally:
        common.stop(helpers, terminate=False)
        common.run_cleanups(cleanup)
    record["load"] += list(os.getloadavg())
    for path in logs:  # ps-lite numbers its workers itself: any log may hold rank 0
        for line in open(path, errors="replace"):
            if line.startswith("RESULT "):
                record.update(json.loads(line[7:]))
                break
    if "params" not in record:
        return dict(record, error=f"no RESULT line: worker 0: {common.log_tail(logs[0])}")
    timed = record.get("stamps") or record.get("cpu_stamps")
    if timed:  # rank 0's timed steps are back to back: their starts and the last end
        record["machine_cpu"] = overlap_step.machine_cpu(
            sampler, [[a] for a, _ in timed] + [[timed[-1][1]]], os.cpu_count() or 1)
    if "stamps" in record:
        steps = [b - a for a, b in record["stamps"]]
        record["step"] = round(_med(steps) / 1e6, 5)
        record["step_min_max"] = [round(min(steps) / 1e6, 5), round(max(steps) / 1e6, 5)]
        if args.timeline and os.path.exists(timeline):
            record["timeline"] = waits(timeline, record["stamps"])
            if args.keep:
                import shutil
                shutil.copy(timeline, os.path.join(args.keep, f"{args.target}_{label}_"
                                                   f"{time.strftime('%H%M%S')}.timeline.json"))
    return record


def waits(path: str, stamps: List[List[float]]) -> Dict[str, Any]:
    """Per step, from rank 0's timeline (ms after the step started): when the core
    got the first and the last gradient, each data message's ready/start/end, the
    link's idle time between the first message's start and the last's end, and what
    the step waited after the last message (the update, the framework's own work)."""
    import overlap_timeline
    msgs = [m for m in overlap_timeline.groups(overlap_timeline.load_events(path))
            if not m.get("round")]
    subs = [e["ts"] for e in overlap_timeline.load_events(path)
            if e.get("ph") == "X" and e["name"] in ("negotiate", "queued")]  # submitted
    per = []
    for z, end in stamps:
        mine = [m for m in msgs if z <= m["start"] < end]
        ready = [s for s in subs if z <= s < end]
        if not mine:
            continue
        busy = sum(m["end"] - m["start"] for m in mine)
        span = mine[-1]["end"] - mine[0]["start"]
        ms = lambda v, z=z: round((v - z) / 1e3, 1)  # noqa: E731
        per.append({
            "step_ms": round((end - z) / 1e3, 1),
            "first_ready_ms": ms(min(ready)) if ready else None,
            "last_ready_ms": ms(max(ready)) if ready else None,
            "first_start_ms": ms(mine[0]["start"]), "last_end_ms": ms(mine[-1]["end"]),
            "transfer_ms": round(busy / 1e3, 1), "idle_between_ms": round((span - busy) / 1e3, 1),
            "after_last_ms": round((end - mine[-1]["end"]) / 1e3, 1),
            "messages": [{"MB": round(m["bytes"] / 1e6, 2), "tensors": len(m["tensors"]),
                          "ready": ms(max(m["submitted"])) if m["submitted"] else None,
                          "start": ms(m["start"]), "end": ms(m["end"])} for m in mine]})
    keys = [k for k in (per[0] if per else {}) if k.endswith("_ms")]
    med = {k: round(_med([p[k] for p in per if p[k] is not None]), 1) for k in keys
           if any(p[k] is not None for p in per)}
    typical = min(per, key=lambda p: abs(p["step_ms"] - med["step_ms"])) if per else None
    return {"median": med, "typical_step": typical, "steps": per}


def _plain(label: str) -> str:
    """MODE of a label MODE[@CODE][%VARIANT]."""
    return label.partition("@")[0].partition("%")[0]


def mode_line(label: str, r: Dict[str, Any]) -> str:
    """One run's result of mode ``label`` in a line: the compute mode's F, B and U (any
    @CODE or %VARIANT of it too), another mode's step."""
    if r.get("error"):
        return r["error"]
    if _plain(label) == "compute":
        return f"F {r['forward']:.3f} B {r['backward']:.3f} U {r['update']:.3f} s"
    return f"step {r['step']:.3f} s ({r['step_min_max'][0]:.3f}-{r['step_min_max'][1]:.3f})"


def cpu_floor_of(run: Dict[str, Any], ranks: int, cores: int) -> Optional[Dict[str, Any]]:
    """The run's CPU floor (step_floor's (d), its arithmetic: ``comm_cpu_of``,
    ``cpu_floor``): the compute mode's ranks' CPU-seconds per step (whole processes,
    its stamped whole steps) plus the paced floor's CPU for the step's S gradient bytes
    (``ranks`` floor ranks and the reflector, scaled per byte from the run's ``floor``
    part), over the cores. Beside it, each mode's step over the floor and its own CPU
    per step (ranks, aggregator, machine busy); ``cpu_floor_daemon_s`` puts the
    netreduce mode's measured aggregator in place of the reflector. None without the
    compute mode's CPU, the floor or the bound.

    On a machine that other work shares, the steps and the bound (wall time) stretch
    and the CPU-seconds do not: ``quiet_bound_s`` is the bound with the compute's F, B,
    U scaled by its quiet step over its measured one (the quiet step: its ranks' CPU per
    step over the cores, the cores all theirs; S/R stays), and each
    mode's ``own_cpu_s`` its ranks' and aggregator's CPU per step over the cores, the
    step it would take with the cores to itself and no wait; read those against the
    floor when the load moved."""
    import step_floor
    res, fl, bnd = run.get("modes") or {}, run.get("floor") or {}, run.get("bound") or {}
    comp = (res.get("compute") or {}).get("machine_cpu") or {}
    if comp.get("ranks_cpu_s_per_step") is None or "rank_cpu_s" not in fl or "bound_s" not in bnd:
        return None
    comm = step_floor.comm_cpu_of(fl, ranks, fl["round_bytes"], bnd["S_bytes"])
    floor_s = step_floor.cpu_floor(comp["ranks_cpu_s_per_step"], comm["comm_cpu_s"], cores)
    out: Dict[str, Any] = {
        "compute_ranks_cpu_s": comp["ranks_cpu_s_per_step"], "compute_busy": comp.get("busy_fraction"),
        "comm_rank_cpu_s": comm["rank_cpu_s"], "comm_aggregator_cpu_s": comm["aggregator_cpu_s"],
        "comm_cpu_s": comm["comm_cpu_s"], "cores": cores, "cpu_floor_s": round(floor_s, 5),
        "bound_s": bnd["bound_s"], "cpu_floor_vs_bound": round(floor_s / bnd["bound_s"], 4),
        "target_vs_cpu_floor": round(1.1 * bnd["bound_s"] / floor_s, 4)}
    wall = (res.get("compute") or {}).get("step")  # F + B + U, the loop that timed them
    if wall and all(k in bnd for k in ("forward", "backward", "update", "transfer")):
        k = comp["ranks_cpu_s_per_step"] / cores / wall
        quiet = k * bnd["forward"] + max(k * bnd["backward"], bnd["transfer"]) + k * bnd["update"]
        out.update(quiet_bound_s=round(quiet, 5), quiet_target_vs_cpu_floor=round(1.1 * quiet / floor_s, 4))
    for mode, rec in res.items():
        mc = rec.get("machine_cpu") or {}
        if _plain(mode) == "compute" or not rec.get("step"):
            continue
        out[f"{mode}_vs_cpu_floor"] = round(rec["step"] / floor_s, 4)
        out[f"{mode}_busy"] = mc.get("busy_fraction")
        out[f"{mode}_ranks_cpu_s"] = mc.get("ranks_cpu_s_per_step")
        out[f"{mode}_cpu_bound_s"] = mc.get("cpu_bound_s")  # all the machine's CPU / cores
        if mc.get("ranks_cpu_s_per_step") is not None:  # what the ranks spend past the compute
            out[f"{mode}_ranks_cpu_over_compute_s"] = round(
                mc["ranks_cpu_s_per_step"] - comp["ranks_cpu_s_per_step"], 4)
        if mc.get("ranks_cpu_s_per_step") is not None:
            own = (mc["ranks_cpu_s_per_step"] + (mc.get("aggregator_cpu_s_per_step") or 0.0)) / cores
            out[f"{mode}_own_cpu_s"] = round(own, 5)
            out[f"{mode}_own_cpu_vs_cpu_floor"] = round(own / floor_s, 4)
        if mc.get("aggregator_cpu_s_per_step") is not None:
            out[f"{mode}_aggregator_cpu_s"] = mc["aggregator_cpu_s_per_step"]
            daemon = step_floor.cpu_floor(comp["ranks_cpu_s_per_step"], ranks * comm["rank_cpu_s"]
                                          + mc["aggregator_cpu_s_per_step"], cores)
            out[f"{mode}_cpu_floor_daemon_s"] = round(daemon, 5)
    return out


def describe(tl: Dict[str, Any], indent: str = "      ") -> str:
    m, out = tl["median"], []
    out.append(indent + "medians, ms after the step starts: gradients reach the core %s..%s; "
               "messages %s..%s, transfer %s, link idle between them %s; step waits %s after "
               "the last one (step %s)" % (
                   m.get("first_ready_ms"), m.get("last_ready_ms"), m.get("first_start_ms"),
                   m.get("last_end_ms"), m.get("transfer_ms"), m.get("idle_between_ms"),
                   m.get("after_last_ms"), m.get("step_ms")))
    for row in (tl.get("typical_step") or {}).get("messages", []):
        out.append(indent + "  %7.2f MB in %2d tensor(s): ready %7s, sent %7.1f .. %7.1f" % (
            row["MB"], row["tensors"], row["ready"], row["start"], row["end"]))
    return "\n".join(out)


def driver(args: argparse.Namespace) -> str:
    import common
    from netreduce.testbed import Testbed, why_unusable
    from netreduce.testbed.plan import parse_rate

    reason = why_unusable()
    if reason:
        raise SystemExit(f"overlap_frameworks.py: {reason}")
    modes = args.modes.split(",") if args.modes else list(MODES[args.target])
    parts = modes + (["floor"] if args.floor else [])
    rate = parse_rate(args.rate)
    runs: List[Dict[str, Any]] = []
    path = ""
    args.commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip()  # at the start
    with Testbed(hosts=args.np, rate=args.rate, mtu=args.mtu, name=args.testbed_name,
                 subnet=args.subnet, replace=True) as tb:
        for i in range(args.runs):
            order = parts[i % len(parts):] + parts[:i % len(parts)]
            res: Dict[str, Any] = {}
            floor_rec: Dict[str, Any] = {}
            for mode in order:
                if mode == "floor":  # step_floor's (d): the paced floor, this testbed
                    import step_floor
                    load = os.getloadavg()[0]
                    try:
                        floor_rec = step_floor.comm_cpu(tb, args, common.parse_size(args.floor_bytes))
                    except Exception as exc:  # keep the run's modes
                        floor_rec = {"error": repr(exc)}
                    floor_rec["load"] = [load, os.getloadavg()[0]]
                    print(f"  run {i} floor: {json.dumps(floor_rec)}", flush=True)
                    continue
                with tempfile.TemporaryDirectory(prefix=f"nrovfw-{mode}-") as tmp:
                    res[mode] = r = run_mode(tb, mode, args, tmp)
                print(f"  run {i} {mode}: {mode_line(mode, r)}; load {r['load'][0]:.1f}", flush=True)
                if "timeline" in r:
                    print(describe(r["timeline"]), flush=True)
            run: Dict[str, Any] = {"run": i, "order": order, "modes": res}
            if floor_rec:
                run["floor"] = floor_rec
            comp = res.get("compute", {})
            if "forward" in comp:
                s_bytes = 4 * comp["params"]
                transfer = s_bytes * 8 / rate
                run["bound"] = {"forward": comp["forward"], "backward": comp["backward"],
                                "update": comp["update"], "S_bytes": s_bytes,
                                "transfer": round(transfer, 5),
                                "bound_s": round(comp["forward"] + max(comp["backward"], transfer)
                                                 + comp["update"], 5)}
                for mode in modes:
                    if res.get(mode, {}).get("step"):
                        run[f"{mode}_step_vs_bound"] = round(res[mode]["step"]
                                                             / run["bound"]["bound_s"], 4)
            if args.floor:
                run["cpu_floor"] = cpu_floor_of(run, args.np, os.cpu_count() or 1)
            peer = next((m for m in modes if not m.startswith("nr-") and _plain(m) != "compute"), None)
            for mode in [m for m in modes if m.startswith("nr-")]:
                if peer and res.get(mode, {}).get("step") and res.get(peer, {}).get("step"):
                    run[f"{mode}_speedup_vs_{peer}"] = round(res[peer]["step"] / res[mode]["step"], 4)
            for label in [m for m in modes if "@" in m]:  # A/B: MODE against MODE@CODE
                mode = _plain(label)
                if res.get(mode, {}).get("step") and res.get(label, {}).get("step"):
                    run[f"{mode}_speedup_vs_{label}"] = round(res[label]["step"] / res[mode]["step"], 4)
            for label in [m for m in modes if "%" in m]:  # A/B: MODE%VARIANT against MODE
                plain = label.partition("%")[0]
                a, b = res.get(plain, {}), res.get(label, {})
                if a.get("step") and b.get("step"):
                    run[f"{label}_step_vs_{plain}"] = round(b["step"] / a["step"], 4)
                ca, cb = [(x.get("machine_cpu") or {}).get("ranks_cpu_s_per_step") for x in (a, b)]
                if ca and cb:
                    run[f"{label}_ranks_cpu_vs_{plain}"] = round(cb / ca, 4)
            runs.append(run)
            print("  " + json.dumps({k: v for k, v in run.items() if k not in ("modes", "order", "floor")}),
                  flush=True)
            path = write(args, modes, runs, path)  # after every run: a cut-short run keeps its runs
    print(json.dumps(json.load(open(path))["summary"], indent=1))
    print(f"# wrote {path}")
    return path


def refloor(path: str) -> None:
    """RECORD's runs' CPU floors (``cpu_floor_of``, this file's arithmetic) and its
    summary again, in place."""
    with open(path) as f:
        record = json.load(f)
    s = record["summary"]
    for run in record["runs"]:
        run["cpu_floor"] = cpu_floor_of(run, s["ranks"], (run.get("floor") or {}).get("cores")
                                        or os.cpu_count() or 1)
    modes = list(record["runs"][0]["modes"])
    words = record["command"].split()
    ns = argparse.Namespace(target=s["target"], rate=s["rate"], mtu=s["mtu"], np=s["ranks"],
                            batch_size=s["batch"], commit=record.get("commit", ""),
                            steps=int(words[words.index("--steps") + 1]) if "--steps" in words else 5,
                            warmup=int(words[words.index("--warmup") + 1]) if "--warmup" in words else 2,
                            out=path)
    write(ns, modes, record["runs"], path, record["command"])
    print(json.dumps(json.load(open(path))["summary"].get("cpu_floor"), indent=1))


def write(args: argparse.Namespace, modes: List[str], runs: List[Dict[str, Any]],
          path: str, command: str = "") -> str:
    import common
    summary: Dict[str, Any] = {"target": args.target, "rate": args.rate, "mtu": args.mtu,
                               "ranks": args.np, "batch": args.batch_size, "model": "alexnet"}
    for key in sorted({k for r in runs for k in r if "_vs_" in k}):
        summary[key] = common.spread([r.get(key) for r in runs])
    for part in ("forward", "backward", "update", "transfer", "bound_s"):
        summary[part] = common.spread([(r.get("bound") or {}).get(part) for r in runs])
    for mode in modes:
        recs = [r["modes"][mode] for r in runs if mode in r["modes"]]
        summary[mode] = {"step_s": common.spread([x.get("step") for x in recs]),
                         "cpu_s_rank0": common.spread([x.get("cpu_s") for x in recs], 2),
                         "wire_tx_per_step_MB": common.spread(
                             [x["wire_tx"] / (args.steps + args.warmup) / 1e6
                              if x.get("wire_tx") else None for x in recs], 1)}
        for part in ("busy_fraction", "ranks_cpu_s_per_step", "aggregator_cpu_s_per_step",
                     "cpu_bound_s"):
            summary[mode]["machine_cpu." + part] = common.spread(
                [(x.get("machine_cpu") or {}).get(part) for x in recs])
        tls = [x["timeline"]["median"] for x in recs if x.get("timeline")]
        if tls:
            summary[mode]["timeline_ms"] = {k: common.spread([t.get(k) for t in tls], 1)
                                            for k in tls[0]}
    floors = [r["cpu_floor"] for r in runs if r.get("cpu_floor")]
    if floors:
        summary["cpu_floor"] = {k: common.spread([f.get(k) for f in floors])
                                for k in floors[0] if k != "cores"}
    summary["load_1min"] = common.spread([x["load"][0] for r in runs for x in r["modes"].values()], 2)
    os.makedirs(OUT, exist_ok=True)
    path = path or args.out or os.path.join(
        OUT, f"overlap_{args.target}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    with open(path, "w") as f:
        json.dump({"command": command or "python3 benchmarks/overlap_frameworks.py " + " ".join(sys.argv[1:]),
                   "commit": args.commit, "summary": summary, "runs": runs}, f, indent=1)
    return path


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", choices=sorted(MODES))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--modes", default="", help="default: the target's netreduce path, its "
                    "peer and compute; also nr-strategy (keras), nr-hvd (mxnet)")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--batch-size", type=int, default=8, help="per rank")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per mode and run")
    ap.add_argument("--no-timeline", dest="timeline", action="store_false",
                    help="no NETREDUCE_TIMELINE on rank 0 of the netreduce modes")
    ap.add_argument("--keep", default="", help="folder to keep the timelines in")
    ap.add_argument("--switch-args", default="")
    ap.add_argument("--nr-env", action="append", default=[], help="KEY=VALUE, netreduce modes")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mode")
    ap.add_argument("--testbed-name", default="nrovfw")
    ap.add_argument("--subnet", default="10.77.34.0/24")
    ap.add_argument("--out", default="")
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                    help="a checkout (built in place) that modes MODE@NAME take the adapter "
                    "from (mxnet)")
    ap.add_argument("--floor", action="store_true",
                    help="each run also measures the paced floor (benchmarks/step_floor.py's (d)) "
                    "and reads every step against the CPU floor; needs the compute mode")
    ap.add_argument("--floor-bytes", default="64M", help="bytes per floor round (scaled per byte to S)")
    ap.add_argument("--floor-rounds", type=int, default=5)
    ap.add_argument("--env-variant", action="append", default=[], metavar="NAME:K=V[,K=V]",
                    help="the environment of modes MODE%%NAME (every rank's process)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--refloor", default="", metavar="RECORD",
                    help="measure nothing: RECORD's CPU floors and summary again (rewritten in place)")
    args = ap.parse_args(argv)
    if args.refloor:
        refloor(args.refloor)
        return 0
    if args.worker:
        worker(args)
        return 0
    import overlap_step
    codes = dict(c.split("=", 1) for c in args.code)
    args.variants = overlap_step.parse_variants(args.env_variant)
    for label in (args.modes.split(",") if args.modes else []):
        mode, code, variant = overlap_step.parse_label(label)
        if variant and variant not in args.variants:
            ap.error(f"--modes: {label!r} names variant {variant!r} that no --env-variant gives")
        if mode not in MODES[args.target] + OPTIONAL[args.target]:
            ap.error(f"unknown mode {mode!r} for {args.target}")
        if code and (args.target != "mxnet" or code not in codes):
            ap.error(f"{label}: MODE@NAME needs the mxnet target and --code NAME=DIR")
    if args.floor and "compute" not in (args.modes.split(",") if args.modes else MODES[args.target]):
        ap.error("--floor needs the compute mode (the ranks' CPU per step without communication)")
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    driver(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
