#!/usr/bin/env python3
"""One rank of the training benchmark (benchmarks/train.py starts it under each
mode's own launcher, or in a testbed host's namespace): the model, one fixed random
batch, warm-up steps, a barrier, the timed steps; rank 0 prints one RESULT line of
JSON (samples/s, the phases, and on the testbed its link's bytes and the CPU it and
the aggregator used).

    python benchmarks/train_rank.py --mode nr-hvd --model alexnet --batch-size 8 ...
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.abspath(__file__)


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
        import common  # (here: only rank 0 of a testbed run reads counters)
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


def argv(mode: str, model: str, args: argparse.Namespace, *extra: str) -> List[str]:
    """The command line of one rank of ``mode`` training ``model`` with train.py's
    batch, steps, warm-up and threads."""
    return [sys.executable, SCRIPT, "--mode", mode, "--model", model,
            "--batch-size", str(args.batch_size), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--threads", str(args.threads), *extra]


def main(arguments: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    # Testbed runs skip the initial parameter broadcast (every rank builds the model
    # from seed 0, so the weights already agree; it is outside the timed window but
    # costs up to 20 s of emulated link time per AlexNet run).
    p.add_argument("--no-init-sync", action="store_true")
    worker(p.parse_args(arguments))
    return 0


if __name__ == "__main__":
    sys.exit(main())
