#!/usr/bin/env python3
"""Failover benchmark (issue 14): what failover costs while nothing fails, what the
host all-reduce gives when no aggregator does, and how long a failover takes.

Loopback, N rank processes through the public API (netreduce.allreduce, so
negotiation included), every configuration in the same run:

* ``aggregator``  NETREDUCE_SWITCH = a netreduce-switch daemon, failover off
                  (NETREDUCE_ALGORITHM=flat everywhere: on one host auto would take
                  the shared-memory path, which failover does not combine with);
* ``failover``    the same daemon with a standby named (NETREDUCE_STANDBY_SWITCH):
                  the scratch copy and rank 0's coordinator are the difference;
* ``host``        NETREDUCE_FALLBACK=host with an unreachable aggregator: the
                  ranks' own in-process aggregators (algorithms/host_fallback.py,
                  switch/in_process.py);
* ``gloo``        torch.distributed all_reduce, gloo backend (ring), the peer;
* ``kill``        failover on, the primary SIGKILLed during the timed loop of the
                  largest size: the slowest step (the failover inside it) against
                  the median step.

    PYTHONPATH=. python benchmarks/failover.py --np 4 --sizes 1M,16M,64M --json out.json

Time per all-reduce = the slowest rank's median over --iters after a warm-up, then
the median over --repeat interleaved runs.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Dict, List, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def worker(impl: str, sizes: List[int], iters: int, mark: str) -> None:
    rank, size = int(os.environ["NETREDUCE_RANK"]), int(os.environ["NETREDUCE_SIZE"])
    out: Dict[str, List[float]] = {}
    if impl == "gloo":
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=size)
        for nbytes in sizes:
            t = torch.ones(nbytes // 4, dtype=torch.float32)
            dist.all_reduce(t)
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                dist.all_reduce(t)
                times.append(time.perf_counter() - t0)
            out[str(nbytes)] = times
        dist.destroy_process_group()
    else:
        import netreduce as nr
        nr.init()
        for nbytes in sizes:
            x = np.ones(nbytes // 4, dtype=np.float32)
            y = nr.allreduce(x, op=nr.Sum, name=f"w{nbytes}")
            assert (y == size).all()
            times = []
            for i in range(iters):
                if impl == "kill" and nbytes == sizes[-1] and i == iters // 2 and rank == 0:
                    open(mark, "w").close()
                t0 = time.perf_counter()
                y = nr.allreduce(x, op=nr.Sum, name=f"b{nbytes}.{i}")
                times.append(time.perf_counter() - t0)
                assert (y == size).all()
            out[str(nbytes)] = times
        out["stats"] = {k: v for k, v in nr.api._comm().dp.stats().items()
                        if k in ("failovers", "path", "algorithm")}  # type: ignore[assignment]
        out["history"] = getattr(nr.api._comm().dp, "history", [])  # type: ignore[assignment]
        nr.shutdown()
    print(json.dumps(out), flush=True)


def run(impl: str, n: int, sizes: List[int], iters: int, switches: List[object]) -> dict:
    from netreduce.process import free_tcp_port
    job = f"fob-{impl}-{uuid.uuid4().hex[:6]}"
    mark = f"/tmp/{job}.mark"
    env = dict(os.environ, NETREDUCE_JOB=job, NETREDUCE_SIZE=str(n),
               NETREDUCE_RENDEZVOUS=f"127.0.0.1:{free_tcp_port()}", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_tcp_port()), WORLD_SIZE=str(n),
               # one host: auto would pick the shared-memory hierarchical all-reduce,
               # which failover does not combine with; compare flat with flat
               NETREDUCE_ALGORITHM="flat",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    addr = lambda sw: f"{sw.address[0]}:{sw.address[1]}"  # noqa: E731
    if impl in ("aggregator", "failover", "kill"):
        env["NETREDUCE_SWITCH"] = addr(switches[0])
    if impl in ("failover", "kill"):
        env["NETREDUCE_STANDBY_SWITCH"] = addr(switches[1])
    if impl == "host":
        env.update(NETREDUCE_SWITCH=f"127.0.0.1:{free_tcp_port()}", NETREDUCE_FALLBACK="host")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl,
           "--sizes", ",".join(map(str, sizes)), "--iters", str(iters), "--mark", mark]
    procs = [subprocess.Popen(cmd, env=dict(env, NETREDUCE_RANK=str(r), RANK=str(r)),
                              stdout=subprocess.PIPE, text=True) for r in range(n)]
    if impl == "kill":
        def kill() -> None:
            while not os.path.exists(mark):
                time.sleep(0.002)
            time.sleep(0.01)
            switches[0].proc.send_signal(signal.SIGKILL)
        threading.Thread(target=kill, daemon=True).start()
    outs = []
    for p in procs:
        stdout, _ = p.communicate(timeout=900)
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    if os.path.exists(mark):
        os.unlink(mark)
    rec: dict = {"impl": impl, "np": n, "sizes": {}}
    for nbytes in sizes:
        per_rank = [np.array(o[str(nbytes)]) for o in outs]
        slowest = np.max(np.stack(per_rank), axis=0)  # per iteration, the slowest rank
        rec["sizes"][str(nbytes)] = {"median_s": float(np.median(slowest)),
                                     "max_s": float(slowest.max())}
    rec["stats"] = outs[0].get("stats")
    rec["history"] = outs[0].get("history")
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3, help="runs of every impl, interleaved")
    ap.add_argument("--impls", default="aggregator,failover,host,gloo,kill")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mark", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [parse_size(s) if not s.isdigit() else int(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(args.worker, sizes, args.iters, args.mark)
        return 0
    sys.path.insert(0, REPO)
    from netreduce.switch import spawn
    records = []
    impls = args.impls.split(",")
    for rep in range(args.repeat):  # interleaved, so that load changes hit every impl
        for impl in impls:
            switches = [spawn(host="127.0.0.1", port=0), spawn(host="127.0.0.1", port=0)]
            try:
                records.append(dict(run(impl, args.np, sizes, args.iters, switches), repeat=rep))
            finally:
                for sw in switches:
                    sw.stop()
            print(json.dumps(records[-1]), flush=True)

    def median(impl: str, nbytes: int, key: str = "median_s") -> float:
        return float(np.median([r["sizes"][str(nbytes)][key] for r in records
                                if r["impl"] == impl]))
    print(f"\n{'size':>8} " + " ".join(f"{i:>11}" for i in impls)
          + f"   (ms: median over {args.repeat} runs of the slowest rank's median)")
    for nbytes in sizes:
        print(f"{nbytes >> 20:>7}M " + " ".join(f"{median(i, nbytes) * 1e3:>11.2f}" for i in impls))
    if "kill" in impls:
        for r in records:
            if r["impl"] == "kill":
                k = r["sizes"][str(sizes[-1])]
                print(f"kill run {r['repeat']}: slowest step {k['max_s'] * 1e3:.0f} ms vs median "
                      f"{k['median_s'] * 1e3:.1f} ms; {r['stats']}; {r['history']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"records": records, "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
