"""Training throughput (samples/s) of data-parallel PyTorch on netreduce and its peers.

    python benchmarks/train.py --framework torch                 # everything, one run
    python benchmarks/train.py --framework torch --models alexnet --ranks 2 \
        --modes nr-hvd,ddp-gloo --steps 5

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
        net = DDP(model)
        if mode == "nr-hook":
            net.register_comm_hook(None, nrt.allreduce_hook)

    gen = torch.Generator().manual_seed(rank)
    images = torch.randn(args.batch_size, 3, 64, 64, generator=gen)
    labels = torch.randint(0, 1000, (args.batch_size,), generator=gen)

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(net(images), labels).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print("RESULT " + json.dumps({
            "mode": mode, "model": args.model, "ranks": size, "batch": args.batch_size,
            "steps": args.steps, "seconds": elapsed, "params": params,
            "samples_per_s": size * args.batch_size * args.steps / elapsed}), flush=True)


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--framework", default="torch", choices=["torch"],
                   help="only PyTorch is implemented")
    p.add_argument("--models", default="resnet18,alexnet")
    p.add_argument("--ranks", default="2,4", help="comma-separated world sizes")
    p.add_argument("--modes", default=",".join(MODES), help=f"any of {','.join(ALL_MODES)}")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--timeout", type=int, default=600, help="seconds per configuration")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of every configuration (median reported), interleaved")
    p.add_argument("--out", default=os.path.join(HERE, "results", "train.md"),
                   help="Markdown report ('' = none)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    args.models = args.models.split(",")
    args.ranks = [int(n) for n in args.ranks.split(",")]
    args.modes = args.modes.split(",")
    for mode in args.modes:
        if mode not in ALL_MODES:
            p.error(f"unknown mode {mode!r}")
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
