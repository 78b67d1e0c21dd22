#!/usr/bin/env python3
"""Tensor fusion benchmark: one training step's gradients of ResNet-50 (its 161
parameter tensors, float32, 25.6 M elements, 102 MB) all-reduced per step.

Three ways, measured in the same run on the same processes:

    fused     netreduce, default fusion threshold (64 MiB): the communicator packs
              same-dtype tensors ready together into one data-plane message
    unfused   netreduce, NETREDUCE_FUSION_THRESHOLD=0: one message per tensor (the
              negotiation is still batched, as Horovod's is with fusion off)
    gloo      torch.distributed, gloo backend, dist.all_reduce tensor by tensor

Each step submits the 161 tensors in reverse order (the order backward produces
gradients) as async operations and waits for all, like a data-parallel optimizer.

    PYTHONPATH=. python benchmarks/fusion.py --np 2,4 --steps 10 \\
        --markdown benchmarks/results/fusion.md

All ranks and the aggregator run on this host (loopback); the shapes are hard-coded
from torchvision's resnet50 (nothing is downloaded). Step time is the slowest
rank's mean over the measured steps, after warm-up steps.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def resnet50_shapes() -> List[Tuple[int, ...]]:
    """The parameter shapes of torchvision.models.resnet50(), in definition order:
    stem conv + bn, 16 bottlenecks (conv1/bn1, conv2/bn2, conv3/bn3, and a
    downsample conv + bn in the first block of each stage), fc."""
    shapes: List[Tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            out = planes * 4
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,),
                       (planes, planes, 3, 3), (planes,), (planes,),
                       (out, planes, 1, 1), (out,), (out,)]
            if b == 0:
                shapes += [(out, inplanes, 1, 1), (out,), (out,)]
            inplanes = out
    shapes += [(1000, 2048), (1000,)]
    return shapes


# --- worker (one rank) ------------------------------------------------------------
def _time_steps(step, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


WORKLOADS = ("resnet50", "resnet50-1d")


def workload_shapes(name: str) -> List[Tuple[int, ...]]:
    """resnet50: all 161 tensors (bandwidth-bound: 96% of the bytes are in tensors
    of 1 MB and more). resnet50-1d: only its 107 one-dimensional tensors (batch-norm
    scales and shifts, fc bias; 4 KB on average), where a per-message cost dominates
    and fusion should show."""
    shapes = resnet50_shapes()
    return shapes if name == "resnet50" else [s for s in shapes if len(s) == 1]


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    import netreduce as nr
    from netreduce import api
    rank = int(os.environ["NETREDUCE_RANK"])
    size = int(os.environ["NETREDUCE_SIZE"])
    expect = size * (size + 1) / 2
    grads = {w: [np.full(s, rank + 1, np.float32) for s in workload_shapes(w)]
             for w in WORKLOADS}
    # small steps are fast: measure more of them for the same confidence
    steps = {"resnet50": args.steps, "resnet50-1d": args.steps * 10}
    results: Dict[str, float] = {}
    base_job = os.environ["NETREDUCE_JOB"]

    for mode, threshold in (("fused", "64M"), ("unfused", "0")):
        os.environ["NETREDUCE_FUSION_THRESHOLD"] = threshold
        os.environ["NETREDUCE_JOB"] = f"{base_job}-{mode}"
        nr.init()
        comm = api._communicator()
        for w in WORKLOADS:
            names = [f"{w}.p{i}" for i in range(len(grads[w]))]

            def step() -> None:
                for g in grads[w]:
                    g.fill(rank + 1)
                handles = [nr.allreduce_async(g, op=nr.Sum, name=n, inplace=True)
                           for g, n in zip(reversed(grads[w]), reversed(names))]
                for h in handles:
                    nr.synchronize(h)

            groups0, requests0 = comm.groups_executed, comm.neg.requests
            results[f"{w}/{mode}"] = _time_steps(step, args.warmup, steps[w])
            assert all((g == expect).all() for g in grads[w]), f"{w} {mode}: wrong sum"
            total = args.warmup + steps[w]
            results[f"{w}/{mode}_messages_per_step"] = (comm.groups_executed - groups0) / total
            results[f"{w}/{mode}_negotiations_per_step"] = (comm.neg.requests - requests0) / total
        nr.barrier()
        nr.shutdown()

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.gloo_port}",
                            rank=rank, world_size=size)
    for w in WORKLOADS:
        tensors = [torch.from_numpy(g) for g in grads[w]]

        def gloo_step() -> None:
            for t in tensors:
                t.fill_(rank + 1)
            for t in reversed(tensors):
                dist.all_reduce(t)

        results[f"{w}/gloo"] = _time_steps(gloo_step, args.warmup, steps[w])
        assert all((t == expect).all() for t in tensors), f"{w} gloo: wrong sum"
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, **results}), flush=True)


# --- driver -----------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_size(n: int, args: argparse.Namespace) -> Dict[str, float]:
    sys.path.insert(0, REPO)
    from netreduce.switch import spawn
    switch = spawn(host="127.0.0.1", port=0)
    try:
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   OMP_NUM_THREADS="1")
        env.pop("NETREDUCE_FUSION_THRESHOLD", None)
        cmd = [sys.executable, "-m", "netreduce.launcher", "-np", str(n), "--switch",
               f"{switch.address[0]}:{switch.address[1]}", "--job", f"fusion-bench-{n}",
               "--", sys.executable, os.path.abspath(__file__), "--worker",
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--gloo-port", str(_free_port())]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    finally:
        switch.stop()
    if proc.returncode != 0:
        raise SystemExit(f"N={n} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    per_rank = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines()
                if "RESULT " in line]
    assert len(per_rank) == n, proc.stdout
    # the slowest rank's step time is the job's step time
    return {k: max(r[k] for r in per_rank) for k in per_rank[0] if k != "rank"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", default="2,4", help="world sizes, comma-separated")
    p.add_argument("--steps", type=int, default=10, help="measured steps per mode")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    p.add_argument("--markdown", default=None, help="write the table (and command, date) here")
    p.add_argument("--json", default=None, help="write raw figures here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--gloo-port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    for w in WORKLOADS:
        shapes = workload_shapes(w)
        elems = sum(math.prod(x) for x in shapes)
        print(f"{w}: {len(shapes)} tensors, {elems} float32 elements "
              f"({elems * 4 / 1e6:.2f} MB) per step")
    rows = []
    for n in [int(x) for x in args.np.split(",")]:
        r = run_size(n, args)
        rows.append((n, r))
        for w in WORKLOADS:
            f, u, g = r[f"{w}/fused"], r[f"{w}/unfused"], r[f"{w}/gloo"]
            print(f"N={n} {w}: fused {f * 1e3:.1f} ms/step "
                  f"({r[f'{w}/fused_messages_per_step']:.1f} data msgs, "
                  f"{r[f'{w}/fused_negotiations_per_step']:.1f} negotiation msgs per step), "
                  f"unfused {u * 1e3:.1f} ms, gloo {g * 1e3:.1f} ms", flush=True)
    command = "PYTHONPATH=. python benchmarks/fusion.py " + " ".join(sys.argv[1:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "rows": rows}, f, indent=2)
    if args.markdown:
        write_markdown(args.markdown, rows, command, args)


def write_markdown(path: str, rows, command: str, args) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Tensor fusion: ResNet-50 gradients per step (loopback)",
        "",
        f"Measured {now} on {platform.node()} ({os.cpu_count()} CPUs, shared with other "
        f"work; load average {os.getloadavg()[0]:.1f} at the end), Python "
        f"{platform.python_version()}.",
        "",
        "```",
        command,
        "```",
        "",
        "One step = all-reduce (sum) of every tensor of the workload, float32, submitted "
        "async in backward order, then wait for all. Step time = the slowest rank's mean "
        f"over the measured steps ({args.steps} for resnet50, {args.steps * 10} for "
        f"resnet50-1d, after {args.warmup} warm-up steps). All ranks and the netreduce-switch "
        "aggregator on one host.",
        "",
    ]
    for w in WORKLOADS:
        shapes = workload_shapes(w)
        elems = sum(math.prod(x) for x in shapes)
        lines += [
            f"## {w}: {len(shapes)} tensors, {elems * 4 / 1e6:.2f} MB per step",
            "",
            "| N | fused ms/step | steps/s | data-plane msgs/step | negotiation msgs/step "
            "| unfused ms/step | steps/s | gloo one-by-one ms/step | steps/s | fused vs unfused "
            "| fused vs gloo |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for n, r in rows:
            f, u, g = r[f"{w}/fused"], r[f"{w}/unfused"], r[f"{w}/gloo"]
            lines.append(
                f"| {n} | {f * 1e3:.1f} | {1 / f:.2f} | "
                f"{r[f'{w}/fused_messages_per_step']:.1f} | "
                f"{r[f'{w}/fused_negotiations_per_step']:.1f} | {u * 1e3:.1f} | {1 / u:.2f} | "
                f"{g * 1e3:.1f} | {1 / g:.2f} | {u / f:.2f}x | {g / f:.2f}x |")
        lines.append("")
    lines += ["\"fused vs X\" = X's step time / netreduce fused step time (> 1: fused is "
              "faster). Message counts are per rank (the most of any rank), averaged over all "
              "steps including warm-up; a negotiation message carries every tensor submitted "
              "in one cycle (NETREDUCE_CYCLE_TIME), as cached ids after the first step.", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
