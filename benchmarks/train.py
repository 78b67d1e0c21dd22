"""Training throughput (samples/s) of data-parallel PyTorch on netreduce and its peers.

    python benchmarks/train.py --framework torch                 # everything, one run
    python benchmarks/train.py --framework torch --models alexnet --ranks 2 \
        --modes nr-hvd,ddp-gloo --steps 5
    PYTHONPATH=. python benchmarks/train.py --framework mxnet --testbed   # benchmarks/train_mxnet.py
    PYTHONPATH=. python benchmarks/train.py --framework tensorflow --testbed  # train_tensorflow.py

Modes, each started with its own launcher on this host:
  nr-hvd    netreduce.torch Horovod API: DistributedOptimizer      (netreduce-run)
  nr-ddp    DDP on the "netreduce" torch.distributed backend      (netreduce-run)
  nr-hook   DDP on gloo with netreduce.torch.allreduce_hook       (netreduce-run)
  ddp-gloo  DDP on torch's gloo backend                            (torchrun)
  hvd-gloo  Horovod 0.28.1 built with Gloo (benchmarks/setup_peers.sh) (horovodrun --gloo)

Models (plain torch.nn, torchvision's layouts; torchvision itself does not install
beside torch 2.13): ResNet-18 (11.7 M parameters, compute-bound) and AlexNet
(61.1 M parameters, 95 % of them in the fully connected layers: communication-bound).
Synthetic data: one fixed random batch per rank, 64x64 images, 1000 classes.
Every mode runs the same model, batch, optimizer (SGD, momentum 0.9) and steps; the
timed window starts after warm-up steps and a barrier; samples/s = N * batch * steps /
rank 0's wall time. Results go to stdout and, as Markdown, to --out.

Testbed (issue 5, root): the same ranks, one per emulated host of netreduce.testbed
(network namespaces on a bridge, every host link shaped to --rate each way, the
aggregator's link N x rate; docs/testbed.md), every mode in one run:

    PYTHONPATH=. python benchmarks/train.py --testbed          # AlexNet + ResNet-18, N=4
    PYTHONPATH=. python benchmarks/train.py --testbed --models alexnet --modes nr-hvd \
        --steps 1 --warmup 0 --out '' --json '' --plot ''     # smoke run

Ranks are started directly in their namespaces (no launcher), as benchmarks/allreduce.py
--testbed does: netreduce modes get NETREDUCE_SWITCH (a netreduce-switch in the
aggregator namespace) and NETREDUCE_RANK/SIZE; DDP modes MASTER_ADDR = host 0's testbed
address and RANK/WORLD_SIZE; Horovod the Gloo rendezvous server of this process (on
the bridge address) and HOROVOD_RANK/SIZE/..., one "host" per namespace. Rank 0 also
reads its link's byte counters (wire bytes per step each way), its own and the
aggregator's CPU time and the machine's busy fraction over the timed window. Writes
--out (Markdown), --json and --plot (PNG: samples/s and speed-up bars).

--rate (default 300mbit per host, each way): AlexNet's 244 MB of gradients then need
~6.6 s of link time per step with in-network aggregation and ~9.8 s in a ring against
well under 1 s of compute (batch 8), so communication dominates, and the whole run (both
models, four modes, 1 warm-up + 3 timed steps) takes ~6-7 minutes. Much faster links
make the 2-core machine, not the links, the bottleneck: netreduce's aggregator used
~1/3 of a core per 100 MB/s of aggregate traffic in benchmarks/results/testbed.md, so
at 1gbit per host it alone would need ~1.7 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ["nr-hvd", "nr-ddp", "ddp-gloo", "hvd-gloo"]
ALL_MODES = MODES + ["nr-hook"]


# --- models ---------------------------------------------------------------------------
def build_model(name: str):
    import torch.nn as nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                nn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    if name == "resnet18":
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        return nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(512, 1000))
    if name == "alexnet":
        return nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.AdaptiveAvgPool2d((6, 6)), nn.Flatten(),
            nn.Dropout(), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
            nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, 1000))
    raise ValueError(f"unknown model {name!r}")


def _engine_stats() -> Optional[Dict[str, int]]:
    """This rank's netreduce data-plane counters (netreduce modes only; the engine's
    stats are not public API, so any failure just means no numbers)."""
    try:
        from netreduce import api
        comm = api._g.comm
        if comm is None:
            return None
        st = comm.dp.stats()
        return {"packets_sent": st.get("packets_sent", 0),
                "retransmits": st.get("retransmits", 0) + st.get("fast_retransmits", 0)}
    except Exception:
        return None


# --- one rank -----------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mode = args.mode

    if mode in ("nr-hvd", "hvd-gloo"):
        if mode == "nr-hvd":
            import netreduce.torch as hvd
        else:
            import horovod.torch as hvd
        hvd.init()
        rank, size, barrier = hvd.rank(), hvd.size(), hvd.barrier
        if not args.no_init_sync:
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        net = model
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        if mode.startswith("nr-"):
            import netreduce.torch as nrt  # registers the backend
        backend = "netreduce" if mode == "nr-ddp" else "gloo"
        init = "env://" if "MASTER_ADDR" in os.environ else "netreduce://"
        dist.init_process_group(backend, init_method=init)
        rank, size, barrier = dist.get_rank(), dist.get_world_size(), dist.barrier
        net = DDP(model, init_sync=not args.no_init_sync)
        if mode == "nr-hook":
            net.register_comm_hook(None, nrt.allreduce_hook)

    gen = torch.Generator().manual_seed(rank)
    images = torch.randn(args.batch_size, 3, 64, 64, generator=gen)
    labels = torch.randint(0, 1000, (args.batch_size,), generator=gen)

    phases = {"forward": 0.0, "backward": 0.0, "update": 0.0}  # rank 0's seconds, timed steps

    def step(timed: bool = False) -> None:
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(net(images), labels)
        t1 = time.perf_counter()
        loss.backward()  # DDP, and Horovod's hooks, start all-reducing here
        t2 = time.perf_counter()
        optimizer.step()  # Horovod API: waits for the last all-reduces here
        if timed:
            phases["forward"] += t1 - t0
            phases["backward"] += t2 - t1
            phases["update"] += time.perf_counter() - t2

    for _ in range(args.warmup):
        step()
    barrier()
    # Testbed runs: rank 0 also reads its link's counters, the aggregator's CPU and
    # the machine's busy fraction around the timed window (benchmarks/common.py).
    ifname = os.environ.get("NRBENCH_IFNAME")
    switch_pid = int(os.environ.get("NRBENCH_SWITCH_PID") or 0) if rank == 0 else 0
    probe = None
    if rank == 0 and ifname:
        sys.path.insert(0, HERE)
        import common
        probe = (common.wire_counters(ifname), common.machine_cpu(), common.self_cpu_seconds(),
                 common.pid_cpu_seconds(switch_pid) if switch_pid else None, _engine_stats())
    start = time.perf_counter()
    for _ in range(args.steps):
        step(timed=True)
    barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        result = {
            "mode": mode, "model": args.model, "ranks": size, "batch": args.batch_size,
            "steps": args.steps, "seconds": elapsed, "params": params,
            "samples_per_s": size * args.batch_size * args.steps / elapsed,
            "phase_s": {k: v / args.steps for k, v in phases.items()}}
        if probe is not None:
            wire0, mach0, cpu0, sw0, eng0 = probe
            eng1 = _engine_stats()
            if eng0 and eng1:  # netreduce modes: data packets sent, retransmitted
                result["nr_packets_per_step"] = (eng1["packets_sent"] - eng0["packets_sent"]) / args.steps
                result["nr_retransmits_per_step"] = (eng1["retransmits"] - eng0["retransmits"]) / args.steps
            wire1 = common.wire_counters(ifname)
            result["cpu_rank0"] = (common.self_cpu_seconds() - cpu0) / elapsed
            result["machine_busy"] = common.machine_busy_fraction(mach0, common.machine_cpu())
            if wire0 and wire1:
                result["wire_tx_per_step"] = (wire1["tx"] - wire0["tx"]) / args.steps
                result["wire_rx_per_step"] = (wire1["rx"] - wire0["rx"]) / args.steps
            if sw0 is not None:
                try:
                    result["cpu_switch"] = (common.pid_cpu_seconds(switch_pid) - sw0) / elapsed
                except OSError:
                    pass
        print("RESULT " + json.dumps(result), flush=True)


# --- driver ---------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(mode: str, n: int, worker_args: List[str]) -> Optional[List[str]]:
    me = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, *worker_args]
    if mode.startswith("nr-"):
        return [sys.executable, "-m", "netreduce.launcher", "-np", str(n), "--", *me]
    if mode == "ddp-gloo":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *me[1:]]
    if mode == "hvd-gloo":
        horovodrun = shutil.which("horovodrun")
        if horovodrun is None:
            return None
        return [horovodrun, "-np", str(n), "-H", f"localhost:{n}", "--gloo", *me]
    raise ValueError(mode)


def _horovod_missing() -> Optional[str]:
    probe = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        return "horovod.torch not importable (run benchmarks/setup_peers.sh)"
    if shutil.which("horovodrun") is None:
        return "horovodrun not on PATH"
    return None


def run_one(mode: str, model: str, n: int, args: argparse.Namespace) -> Dict:
    record = {"mode": mode, "model": model, "ranks": n}
    if mode == "hvd-gloo":
        missing = _horovod_missing()
        if missing:
            return dict(record, error=missing)
    worker_args = ["--model", model, "--batch-size", str(args.batch_size),
                   "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--threads", str(args.threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = _command(mode, n, worker_args)
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(record, error=f"timed out after {args.timeout} s")
    for line in proc.stdout.splitlines():
        if "RESULT " in line:
            return dict(record, **json.loads(line.split("RESULT ", 1)[1]))
    tail = " | ".join(proc.stdout.strip().splitlines()[-3:])
    return dict(record, error=f"exit {proc.returncode}: {tail[-300:]}")


def markdown(records: List[Dict], args: argparse.Namespace, started: str) -> str:
    sys.path.insert(0, HERE)
    try:
        from common import machine_description
        machine = machine_description()
    except Exception:  # the benchmark helpers are optional here
        machine = {"cores": os.cpu_count()}
    lines = [
        "# Training throughput: netreduce vs DDP-gloo vs Horovod-gloo (PyTorch)", "",
        f"Measured {started} UTC with", "",
        "    " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "",
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cores')} cores, "
        f"{machine.get('memory_gib', '?')} GiB; every rank on this one host (loopback), "
        f"{args.threads} torch thread(s) per rank. Batch {args.batch_size} per rank, "
        f"64x64 synthetic images, SGD momentum 0.9, {args.warmup} warm-up + {args.steps} "
        f"timed steps. samples/s over all ranks (higher is better): median of {args.repeat} "
        "runs (min–max); the runs of all modes are interleaved so that load from other "
        "processes on the host falls on every mode alike.", "",
        "| model | N | " + " | ".join(args.modes) + " |",
        "|---|---|" + "---|" * len(args.modes),
    ]
    for model in args.models:
        for n in args.ranks:
            cells = []
            for mode in args.modes:
                values = sorted(r["samples_per_s"] for r in records
                                if (r["mode"], r["model"], r["ranks"]) == (mode, model, n)
                                and "error" not in r)
                if not values:
                    cells.append("—")
                elif len(values) == 1:
                    cells.append(f"{values[0]:.1f}")
                else:
                    median = values[len(values) // 2] if len(values) % 2 else \
                        (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
                    cells.append(f"**{median:.1f}** ({values[0]:.1f}–{values[-1]:.1f})")
            lines.append(f"| {model} | {n} | " + " | ".join(cells) + " |")
    errors = [r for r in records if "error" in r]
    if errors:
        lines += ["", "Not measured:", ""]
        lines += [f"- {r['mode']} {r['model']} N={r['ranks']}: {r['error']}" for r in errors]
    lines += ["", "Raw records (JSON lines):", "", "```"]
    lines += [json.dumps(r) for r in records] + ["```", ""]
    return "\n".join(lines)


# --- testbed (issue 5) ------------------------------------------------------------------
TESTBED_OUT = os.path.join(HERE, "results", "train_testbed")
BASELINES = ("ddp-gloo", "hvd-gloo")


def _tail(path: str, lines: int = 4) -> str:
    try:
        with open(path, errors="replace") as f:
            text = [ln for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-400:]


def _udp_socket_drops(tb) -> int:
    """UDP datagrams the kernel dropped for a full socket buffer, all namespaces."""
    total = 0
    for node in [*tb.hosts, tb.aggregator]:
        text = tb.run(node, ["cat", "/proc/net/snmp"], capture_output=True, text=True).stdout
        rows = [line.split() for line in text.splitlines() if line.startswith("Udp:")]
        if len(rows) >= 2:
            total += int(dict(zip(rows[0][1:], rows[1][1:])).get("RcvbufErrors", 0))
    return total


def run_one_testbed(tb, mode: str, model: str, n: int, args: argparse.Namespace) -> Dict:
    """One (mode, model) run, rank r in testbed host r; rank 0's RESULT line + the
    shapers' queue drops during the run."""
    import shlex
    import tempfile
    import uuid

    sys.path.insert(0, HERE)
    import allreduce as ar  # its launch helpers: _wait_all, _worker_env
    import common

    record = {"mode": mode, "model": model, "ranks": n}
    L = args.per_host  # ranks per emulated host: rank r runs in host r // L
    if mode == "hvd-gloo":
        missing = _horovod_missing()
        if missing:
            return dict(record, error=missing)
    tmp = tempfile.mkdtemp(prefix=f"nrtrain-{mode}-")
    me = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode,
          "--model", model, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
          "--warmup", str(args.warmup), "--threads", str(args.threads), "--no-init-sync"]
    common_env = {"OMP_NUM_THREADS": str(args.threads), "NRBENCH_IFNAME": tb.ifname,
                  "PYTHONUNBUFFERED": "1"}
    per_rank: List[Dict[str, str]] = [{} for _ in range(n)]
    cleanup = []
    logs = [os.path.join(tmp, f"rank{r}.log") for r in range(n)]
    try:
        if mode.startswith("nr-"):
            sw = tb.spawn_switch(args=shlex.split(args.switch_args))
            cleanup.append(sw.stop)
            common_env.update(NETREDUCE_SWITCH=f"{sw.address[0]}:{sw.address[1]}",
                              NETREDUCE_JOB=f"train-{uuid.uuid4().hex[:8]}",
                              NETREDUCE_SIZE=str(n), NETREDUCE_LOCAL_SIZE=str(L))
            per_rank[0]["NRBENCH_SWITCH_PID"] = str(sw.pid)
            for r in range(n):
                per_rank[r].update(NETREDUCE_RANK=str(r), NETREDUCE_LOCAL_RANK=str(r % L))
        if mode in ("nr-ddp", "nr-hook", "ddp-gloo"):
            # TCPStore in host 0's namespace, reached over the emulated links.
            common_env.update(MASTER_ADDR=tb.hosts[0].address, MASTER_PORT=str(ar._free_port()),
                              WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(L))
            for r in range(n):
                per_rank[r].update(RANK=str(r), LOCAL_RANK=str(r % L))
        if mode in ("nr-hook", "ddp-gloo", "hvd-gloo"):
            common_env["GLOO_SOCKET_IFNAME"] = tb.ifname
        if mode == "hvd-gloo":
            from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
            from horovod.runner.http.http_server import RendezvousServer
            rdv = RendezvousServer(verbose=0)
            port = rdv.start()
            cleanup.append(rdv.stop)
            plan = get_host_assignments(parse_hosts(",".join(f"h{i}:{L}" for i in range(n // L))), n)
            rdv.init(plan)
            common_env.update(HOROVOD_GLOO_RENDEZVOUS_ADDR=tb.plan.bridge_address,
                              HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), HOROVOD_CONTROLLER="gloo",
                              HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE=tb.ifname)
            for r, slot in enumerate(plan):
                per_rank[r].update(
                    HOROVOD_HOSTNAME=slot.hostname, HOROVOD_RANK=str(slot.rank),
                    HOROVOD_SIZE=str(slot.size), HOROVOD_LOCAL_RANK=str(slot.local_rank),
                    HOROVOD_LOCAL_SIZE=str(slot.local_size), HOROVOD_CROSS_RANK=str(slot.cross_rank),
                    HOROVOD_CROSS_SIZE=str(slot.cross_size))
        drops0 = sum(tb.qdisc_drops().values())
        sock0 = _udp_socket_drops(tb)
        procs = []
        for r in range(n):
            env = ar._worker_env(dict(common_env, **per_rank[r]))
            with open(logs[r], "w") as log:
                procs.append(tb.popen(r // L, me, env=env, cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT))
        t0 = time.monotonic()
        try:
            ar._wait_all(procs, args.timeout, f"{mode} {model} N={n}")
        except RuntimeError as exc:
            return dict(record, error=f"{exc}: rank 0: {_tail(logs[0])}")
        record["wall_s"] = time.monotonic() - t0
        record["queue_drops"] = sum(tb.qdisc_drops().values()) - drops0
        record["socket_drops"] = _udp_socket_drops(tb) - sock0
        if mode.startswith("nr-"):  # were the retransmissions needed? (whole run)
            from netreduce.protocol.client import ControlClient
            with ControlClient(sw.address) as c:
                g = c.call("counters")["global"]
            record["switch"] = {k: g[k] for k in ("packets_in", "duplicates",
                                                  "retransmitted_results", "drops")}
        with open(logs[0], errors="replace") as f:
            for line in f:
                if "RESULT " in line:
                    return dict(record, **json.loads(line.split("RESULT ", 1)[1]))
        return dict(record, error=f"no RESULT from rank 0: {_tail(logs[0])}")
    finally:
        common.run_cleanups(cleanup)
        shutil.rmtree(tmp, ignore_errors=True)


def _median(values: List[float]) -> Optional[float]:
    values = sorted(values)
    if not values:
        return None
    k = len(values) // 2
    return values[k] if len(values) % 2 else (values[k - 1] + values[k]) / 2


def testbed_summary(records: List[Dict], models: List[str], modes: List[str]) -> Dict:
    """{model: {mode: median samples/s}} and {model: {nr-mode: {baseline: speed-up}}}."""
    rates, speedups = {}, {}
    for model in models:
        rates[model] = {m: _median([r["samples_per_s"] for r in records if r["model"] == model
                                    and r["mode"] == m and "error" not in r]) for m in modes}
        speedups[model] = {}
        for nr in (m for m in modes if m.startswith("nr-")):
            for base in (m for m in modes if not m.startswith("nr-")):
                a, b = rates[model][nr], rates[model][base]
                if a and b:
                    speedups[model].setdefault(nr, {})[base] = a / b
    return {"samples_per_s": rates, "speedup": speedups}


def _link_seconds(r: Dict, rate: str) -> Optional[float]:
    """Seconds per step rank 0's shaped link needs for the bytes it carried."""
    if "wire_tx_per_step" not in r:
        return None
    from netreduce.testbed import parse_rate
    return max(r["wire_tx_per_step"], r["wire_rx_per_step"]) * 8 / parse_rate(rate)


def testbed_markdown(meta: Dict, records: List[Dict], summary: Dict) -> str:
    m = meta["machine"]
    modes, models = meta["modes"], meta["models"]
    la0 = "/".join(f"{x:.2f}" for x in meta["loadavg_at_start"])
    la1 = "/".join(f"{x:.2f}" for x in meta["loadavg_at_end"])
    out = [
        "# Training throughput on the emulated testbed: netreduce vs DDP-gloo vs Horovod-gloo",
        "",
        f"- date: {meta['date']} (run took {meta['duration_s']:.0f} s)",
        f"- command: `{meta['command']}`",
        f"- machine: {m.get('cpu')} x{m.get('cores')} cores, {m.get('memory_gib')} GiB, kernel "
        f"{m.get('kernel')}; Python {m.get('python')}, torch {m.get('torch')}, horovod "
        f"{m.get('horovod')}",
        f"- load average (1/5/15 min) at start: {la0}; at end: {la1}"
        + (" (1-min value every 10 s during the run: %.2f–%.2f)" % tuple(meta["loadavg_1min_during"])
           if meta.get("loadavg_1min_during") else "") + "; 2 cores shared with other work",
        f"- testbed: {meta['ranks'] // meta.get('per_host', 1)} host namespaces + aggregator "
        f"namespace on a bridge, each "
        f"host link shaped to **{meta['rate']}** each way (tc tbf), aggregator link "
        f"{meta['ranks'] // meta.get('per_host', 1)} x that, MTU 9000, no loss; "
        f"{meta.get('per_host', 1)} rank(s) per host namespace, netreduce's "
        "aggregator (netreduce-switch, payload 8192 B) alone in its namespace "
        f"{('(switch args `' + meta['switch_args'] + '`)') if meta['switch_args'] else ''}",
        f"- training: batch {meta['batch']} per rank, 64x64 synthetic images, 1000 classes, "
        f"SGD momentum 0.9, {meta['threads']} torch thread per rank, {meta['warmup']} warm-up + "
        f"{meta['steps']} timed steps; samples/s = N x batch x steps / rank 0's time between "
        f"barriers; {meta['repeat']} run(s) per cell (median shown), modes interleaved; "
        "every rank builds the model from seed 0, so the initial parameter broadcast "
        "(outside the timed window) is skipped to keep the run short",
        "- modes: nr-hvd = netreduce.torch Horovod API (DistributedOptimizer); nr-ddp = DDP "
        "on the \"netreduce\" torch.distributed backend; ddp-gloo = DDP on gloo; hvd-gloo = "
        "Horovod 0.28.1 with Gloo",
        "",
        "## samples/s (higher is better)",
        "",
        "| model | params | gradient MB/step | " + " | ".join(modes) + " |",
        "|---|---|---|" + "---|" * len(modes),
    ]
    for model in models:
        params = next((r["params"] for r in records if r["model"] == model and "params" in r), 0)
        cells = []
        for mode in modes:
            vals = sorted(r["samples_per_s"] for r in records
                          if (r["model"], r["mode"]) == (model, mode) and "error" not in r)
            med = summary["samples_per_s"][model][mode]
            if med is None:
                cells.append("—")
            elif len(vals) == 1:
                cells.append(f"{med:.2f}")
            else:
                cells.append(f"**{med:.2f}** ({vals[0]:.2f}–{vals[-1]:.2f})")
        out.append(f"| {model} | {params / 1e6:.1f} M | {params * 4 / 1e6:.0f} | "
                   + " | ".join(cells) + " |")
    out += ["", "## speed-up of netreduce (netreduce samples/s / baseline samples/s)", "",
            f"Target (issue 5): AlexNet-like at N = {meta['ranks']} >= 1.5x both baselines. "
            f"Pure-communication bound at N = {meta['ranks']}: a ring moves 2(N-1)/N = "
            f"{2 * (meta['ranks'] - 1) / meta['ranks']:.2f} x the gradient bytes per host each "
            "way, in-network aggregation 1 x.", ""]
    bases = [b for b in modes if not b.startswith("nr-")]
    out += ["| model | netreduce mode | " + " | ".join(f"vs {b}" for b in bases) + " |",
            "|---|---|" + "---|" * len(bases)]
    for model in models:
        for nr, row in summary["speedup"][model].items():
            out.append(f"| {model} | {nr} | " + " | ".join(
                f"{row[b]:.2f}x" if b in row else "—" for b in bases) + " |")
    target = [(nr, b, v) for nr, row in summary["speedup"].get("alexnet", {}).items()
              for b, v in row.items()]
    if target:
        out += ["", "Target check (AlexNet-like, N = %d, >= 1.50x):" % meta["ranks"], ""]
        for nr, b, v in target:
            verdict = "met" if v >= 1.5 else f"missed by {1.5 - v:.2f}x ({(1.5 - v) / 1.5:.0%})"
            out.append(f"- {nr} vs {b}: {v:.2f}x — {verdict}")
    out += ["", "## per run: rank 0's link and CPU over the timed window", "",
            "wire = bytes rank 0's host link carried per step each way (veth counters, whole "
            "frames), over the gradient bytes S; CPU as a fraction of one core; machine = "
            "whole-machine busy fraction (includes softirq, i.e. the emulated network's work); "
            "netreduce retx = data packets rank 0 retransmitted / sent"
            "; aggregator dup = packets the aggregator received twice / all it received, "
            "whole run, all ranks (a resend of a packet that was not lost); socket drops = "
            "datagrams the kernel dropped for a full socket buffer, all namespaces"
            "; link s/step = max(wire tx, wire rx) per step / link rate, the time the shaped "
            "link alone needs (share = that / s/step)",
            "", "| model | mode | run | samples/s | s/step | link s/step (share) | wire tx/S | "
            "wire rx/S | rank-0 CPU | aggregator CPU | machine busy | queue drops | netreduce retx "
            "| aggregator dup | socket drops |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            continue
        s = r["params"] * 4
        per_step = r["seconds"] / r["steps"]
        link = _link_seconds(r, meta["rate"])
        out.append(
            f"| {r['model']} | {r['mode']} | {r.get('run', 0)} | {r['samples_per_s']:.2f} | "
            f"{per_step:.2f} | "
            + (f"{link:.2f} ({link / per_step:.0%}) | " if link else "- | ")
            + (f"{r['wire_tx_per_step'] / s:.3f} | {r['wire_rx_per_step'] / s:.3f}"
               if "wire_tx_per_step" in r else "- | -")
            + f" | {r.get('cpu_rank0', 0):.0%} | "
            + (f"{r['cpu_switch']:.0%}" if "cpu_switch" in r else "-")
            + f" | {r.get('machine_busy', 0):.0%} | {r.get('queue_drops', '-')} | "
            + (f"{r['nr_retransmits_per_step'] / r['nr_packets_per_step']:.1%}"
               if r.get("nr_packets_per_step") else "-")
            + (f" | {r['switch']['duplicates'] / max(r['switch']['packets_in'], 1):.1%}"
               if "switch" in r else " | -")
            + f" | {r.get('socket_drops', '-')} |")
    timed = [r for r in records if "phase_s" in r and "error" not in r]
    if timed:
        out += ["", "## where rank 0's step goes (seconds per step)", "",
                "forward = model + loss (no communication in any mode); backward = autograd, "
                "during which DDP and the Horovod hooks already all-reduce; update = "
                "optimizer.step(), which for the Horovod API first waits for the all-reduces; "
                "beyond link = s/step - link s/step, the time the step is not moving "
                "gradient bytes on the shaped link", "",
                "| model | mode | run | forward | backward | update | s/step | link s/step | "
                "beyond link |", "|---|---|---|---|---|---|---|---|---|"]
        for r in timed:
            per_step, link, ph = r["seconds"] / r["steps"], _link_seconds(r, meta["rate"]), r["phase_s"]
            out.append(f"| {r['model']} | {r['mode']} | {r.get('run', 0)} | {ph['forward']:.2f} | "
                       f"{ph['backward']:.2f} | {ph['update']:.2f} | {per_step:.2f} | "
                       + (f"{link:.2f} | {per_step - link:.2f} |" if link else "- | - |"))
    errors = [r for r in records if "error" in r]
    if errors:
        out += ["", "Not measured:", ""]
        out += [f"- {r['mode']} {r['model']} N={r['ranks']}: {r['error']}" for r in errors]
    return "\n".join(out) + "\n"


def testbed_plot(meta: Dict, summary: Dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models, modes = meta["models"], meta["modes"]
    colors = {"nr-hvd": "#d62728", "nr-ddp": "#ff7f0e", "nr-hook": "#e377c2",
              "ddp-gloo": "#1f77b4", "hvd-gloo": "#9467bd"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    width = 0.8 / max(len(modes), 1)
    for k, mode in enumerate(modes):
        xs = [i + (k - (len(modes) - 1) / 2) * width for i in range(len(models))]
        ys = [summary["samples_per_s"][m][mode] or 0 for m in models]
        bars = ax1.bar(xs, ys, width, label=mode, color=colors.get(mode))
        ax1.bar_label(bars, fmt="%.1f", fontsize=7)
    ax1.set_xticks(range(len(models)), models)
    ax1.set_ylabel("samples/s (all ranks)")
    ax1.set_title(f"throughput, N={meta['ranks']}, {meta['rate']}/host, batch {meta['batch']}")
    ax1.legend(fontsize=8)
    pairs = [(nr, b) for nr in modes if nr.startswith("nr-") for b in modes if not b.startswith("nr-")]
    width = 0.8 / max(len(pairs), 1)
    for k, (nr, b) in enumerate(pairs):
        xs = [i + (k - (len(pairs) - 1) / 2) * width for i in range(len(models))]
        ys = [summary["speedup"][m].get(nr, {}).get(b, 0) for m in models]
        bars = ax2.bar(xs, ys, width, label=f"{nr} / {b}", color=colors.get(nr),
                       hatch="//" if b == "hvd-gloo" else None, edgecolor="white")
        ax2.bar_label(bars, fmt="%.2f", fontsize=7)
    n = meta["ranks"]
    ax2.axhline(2 * (n - 1) / n, color="k", ls="--", lw=1,
                label=f"comm-only bound 2(N-1)/N = {2 * (n - 1) / n:.2f}")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set_xticks(range(len(models)), models)
    ax2.set_ylabel("speed-up (netreduce / baseline samples/s)")
    ax2.set_title("netreduce speed-up (target: alexnet >= 1.5x)")
    ax2.legend(fontsize=7, loc="upper right")
    ax2.set_ylim(0, max(2.0, ax2.get_ylim()[1] * 1.15))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def testbed_main(args: argparse.Namespace) -> int:
    from netreduce.testbed import Testbed, why_unusable

    sys.path.insert(0, HERE)
    import common

    reason = why_unusable()
    if reason:
        print(f"train.py --testbed: {reason}", file=sys.stderr)
        return 2
    if len(args.ranks) != 1:
        print("train.py --testbed: one world size per run (--ranks N)", file=sys.stderr)
        return 2
    n = args.ranks[0]
    if args.per_host < 1 or n % args.per_host:
        print(f"train.py --testbed: --per-host {args.per_host} does not divide {n} ranks",
              file=sys.stderr)
        return 2
    t_start = time.monotonic()
    meta = {"date": common.utc_now(), "command": common.command_line(),
            "machine": common.machine_description(), "loadavg_at_start": os.getloadavg(),
            "mode": "testbed", "rate": args.rate, "ranks": n, "models": args.models,
            "modes": args.modes, "batch": args.batch_size, "steps": args.steps,
            "warmup": args.warmup, "threads": args.threads, "repeat": args.repeat,
            "switch_args": args.switch_args, "testbed_name": args.testbed_name,
            "per_host": args.per_host}
    records: List[Dict] = []
    import threading
    samples: List[float] = []
    done = threading.Event()

    def sample_load() -> None:  # the 1-minute load average every 10 s while running
        while not done.is_set():
            samples.append(os.getloadavg()[0])
            done.wait(10)

    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    with Testbed(hosts=n // args.per_host, rate=args.rate, name=args.testbed_name, subnet=args.subnet,
                 replace=True) as tb:
        print("# " + tb.describe().replace("\n", "\n# "), flush=True)
        print(f"{'model':9} {'N':>2} {'mode':9} {'samples/s':>10} {'s/step':>7} {'cpu0':>5} "
              f"{'agg':>5} {'mach':>5} {'tx/S':>6}", flush=True)
        for rep in range(args.repeat):
            for model in args.models:
                for mode in args.modes:
                    if rep and any("error" in r and (r["mode"], r["model"]) == (mode, model)
                                   for r in records):
                        continue
                    r = dict(run_one_testbed(tb, mode, model, n, args), run=rep)
                    records.append(r)
                    if "error" in r:
                        print(f"{model:9} {n:2d} {mode:9} FAILED {r['error']}", flush=True)
                        continue
                    tx = r.get("wire_tx_per_step", 0) / (4 * r["params"])
                    sw = f"{r['cpu_switch']:5.0%}" if "cpu_switch" in r else f"{'-':>5}"
                    print(f"{model:9} {n:2d} {mode:9} {r['samples_per_s']:10.2f} "
                          f"{r['seconds'] / r['steps']:7.2f} {r.get('cpu_rank0', 0):5.0%} {sw} "
                          f"{r.get('machine_busy', 0):5.0%} {tx:6.3f}   ({r['wall_s']:.0f} s"
                          + (f", retx {r['nr_retransmits_per_step'] / r['nr_packets_per_step']:.1%}"
                             if r.get("nr_packets_per_step") else "")
                          + (f", aggregator duplicates {r['switch']['duplicates']} of "
                             f"{r['switch']['packets_in']} in" if "switch" in r else "")
                          + f", socket drops {r.get('socket_drops', '-')})",
                          flush=True)
    done.set()
    meta["loadavg_at_end"] = os.getloadavg()
    meta["loadavg_1min_during"] = [min(samples), max(samples)] if samples else None
    meta["duration_s"] = time.monotonic() - t_start
    summary = testbed_summary(records, args.models, args.modes)
    for model, row in summary["speedup"].items():
        for nr, vs in row.items():
            print(f"# speed-up {model} {nr}: " + ", ".join(f"{v:.2f}x vs {b}" for b, v in vs.items()))
    for path in (args.out, args.json, args.plot):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if args.json:
        common.write_json(args.json, dict(meta, summary=summary), records)
        print(f"wrote {args.json}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(testbed_markdown(meta, records, summary))
        print(f"wrote {args.out}")
    if args.plot:
        testbed_plot(meta, summary, args.plot)
        print(f"wrote {args.plot}")
    return 0 if all("error" not in r for r in records if r["mode"] != "hvd-gloo") else 1


def main() -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--framework", default="torch")
    known, rest = pre.parse_known_args()
    if known.framework == "mxnet":  # its model and loop, workers in MXNet's own venv
        sys.path.insert(0, HERE)
        import train_mxnet
        return train_mxnet.main(rest)
    if known.framework == "tensorflow":  # Keras model and loop: benchmarks/train_tensorflow.py
        sys.path.insert(0, HERE)
        import train_tensorflow
        return train_tensorflow.main(rest)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--framework", default="torch", choices=["torch", "mxnet"],
                   help="torch (this file) or mxnet (benchmarks/train_mxnet.py, --testbed)")
    p.add_argument("--models", default="resnet18,alexnet")
    p.add_argument("--ranks", default="2,4", help="comma-separated world sizes")
    p.add_argument("--modes", default=",".join(MODES), help=f"any of {','.join(ALL_MODES)}")
    p.add_argument("--batch-size", type=int, default=None, help="per rank (default 16; testbed 8)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; testbed 3)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 3; testbed 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--timeout", type=int, default=600, help="seconds per configuration")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs of every configuration (median reported), interleaved "
                        "(default 3; testbed 1)")
    p.add_argument("--out", default=None,
                   help="Markdown report ('' = none; default results/train.md, testbed "
                        "results/train_testbed.md)")
    p.add_argument("--testbed", action="store_true",
                   help="one rank per emulated host of netreduce.testbed (root), N=4 by default")
    p.add_argument("--rate", default="300mbit",
                   help="testbed: each host link's rate each way, tc syntax (default 300mbit)")
    p.add_argument("--per-host", type=int, default=1,
                   help="testbed: ranks per emulated host (netreduce then runs hierarchical)")
    p.add_argument("--testbed-name", default="nrtrain", help="testbed name prefix (default nrtrain)")
    p.add_argument("--subnet", default="10.80.0.0/24", help="testbed subnet (default 10.80.0.0/24)")
    p.add_argument("--switch-args", default="", help="testbed: extra netreduce-switch options")
    p.add_argument("--json", default=None,
                   help="testbed: records + metadata as JSON ('' = none; default "
                        "results/train_testbed.json)")
    p.add_argument("--plot", default=None,
                   help="testbed: PNG (samples/s, speed-up bars) ('' = none; default "
                        "results/train_testbed.png)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    # Testbed runs skip the initial parameter broadcast (every rank builds the model
    # from seed 0, so the weights already agree; it is outside the timed window but
    # costs up to 20 s of emulated link time per AlexNet run).
    p.add_argument("--no-init-sync", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    tb = args.testbed
    for name, loop, testbed in (("batch_size", 16, 8), ("steps", 10, 3), ("warmup", 3, 1),
                                ("repeat", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, testbed if tb else loop)
    if args.worker:
        worker(args)
        return 0
    if args.out is None:
        args.out = TESTBED_OUT + ".md" if tb else os.path.join(HERE, "results", "train.md")
    args.json = TESTBED_OUT + ".json" if args.json is None and tb else args.json
    args.plot = TESTBED_OUT + ".png" if args.plot is None and tb else args.plot
    if tb and args.ranks == "2,4":
        args.ranks = "4"
    args.models = args.models.split(",")
    args.ranks = [int(n) for n in args.ranks.split(",")]
    args.modes = args.modes.split(",")
    for mode in args.modes:
        if mode not in ALL_MODES:
            p.error(f"unknown mode {mode!r}")
    if tb:
        return testbed_main(args)
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    records = []
    print(f"{'model':9} {'N':>2} {'mode':9} {'samples/s':>10}", flush=True)
    for rep in range(args.repeat):
        for model in args.models:
            for n in args.ranks:
                for mode in args.modes:
                    if rep and any("error" in r and (r["mode"], r["model"], r["ranks"]) ==
                                   (mode, model, n) for r in records):
                        continue  # failed once (e.g. Horovod missing): do not retry
                    r = dict(run_one(mode, model, n, args), run=rep)
                    records.append(r)
                    value = f"{r['samples_per_s']:10.1f}" if "error" not in r else r["error"]
                    print(f"{model:9} {n:2d} {mode:9} {value}", flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(markdown(records, args, started))
        print(f"wrote {args.out}")
    return 0 if all("error" not in r for r in records if r["mode"] != "hvd-gloo") else 1


if __name__ == "__main__":
    sys.exit(main())
