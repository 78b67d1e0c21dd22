#!/usr/bin/env python3
"""The cost of NETREDUCE_DETERMINISTIC=1: flat all-reduce through one netreduce-switch,
rank-order folding on against the default (arrival order), same daemon, same run.

    PYTHONPATH=. python benchmarks/deterministic.py --np 4 --size 64M --iters 5

Loopback: N rank processes (netreduce.worker.dataplane, the raw data plane) and the daemon
on this machine. The two modes alternate job by job (default, deterministic, default,
...) so that machine load hits both alike. Time: per iteration the slowest rank's,
median over --iters after one verified warm-up; the aggregator's `ordered_staged`
counter says how many contributions arrived before a lower rank's and had to wait.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def _rank(rank, n, address, job, count, iters, deterministic, barrier, q):
    import numpy as np

    from netreduce.worker import dataplane
    with dataplane.connect(address, job, rank, n, timeout=60.0,
                           deterministic=deterministic) as conn:
        assert conn.deterministic == deterministic
        buf = np.full(count, rank + 1, dtype=np.float32)
        times = []
        for i in range(iters + 1):
            buf.fill(rank + 1)
            barrier.wait()
            t0 = time.perf_counter()
            conn.allreduce(buf)
            dt = time.perf_counter() - t0
            if i == 0:
                assert float(buf[0]) == n * (n + 1) / 2 and float(buf[-1]) == n * (n + 1) / 2
            else:
                times.append(dt)
        barrier.wait()
        counters = conn.counters()["jobs"][job] if rank == 0 else {}
    q.put((rank, times, counters))


def _one(address, n, count, iters, deterministic):
    ctx = mp.get_context("fork")
    q, barrier = ctx.Queue(), ctx.Barrier(n)
    job = f"det-bench-{uuid.uuid4().hex[:6]}"
    procs = [ctx.Process(target=_rank, args=(r, n, address, job, count, iters, deterministic,
                                             barrier, q)) for r in range(n)]
    for p in procs:
        p.start()
    got = [q.get(timeout=600) for _ in range(n)]
    for p in procs:
        p.join(30)
        if p.exitcode != 0:
            raise SystemExit(f"rank exited with {p.exitcode}")
    slowest = [max(t[i] for _, t, _ in got) for i in range(iters)]
    counters = next(c for r, _, c in got if r == 0)
    return slowest, counters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--size", default="64M", help="all-reduce size per rank (float32)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="jobs per mode, alternating")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    text = str(args.size).upper().rstrip("B").rstrip("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    size_bytes = int(float(text.rstrip("KMG")) * scale)
    count = size_bytes // 4

    from netreduce.switch import spawn
    sw = spawn(host="127.0.0.1", port=0)
    times = {False: [], True: []}
    staged = {False: 0, True: 0}
    chunks = {False: 0, True: 0}
    try:
        for _ in range(args.rounds):
            for det in (False, True):
                t, c = _one(sw.address, args.np, count, args.iters, det)
                times[det] += t
                staged[det] += int(c.get("ordered_staged", 0))
                chunks[det] += int(c.get("slots_completed", 0)) * args.np
    finally:
        sw.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"N={args.np}, S={size_bytes / 2**20:.0f} MiB float32 all-reduce, flat, loopback; "
          f"median of {len(times[False])} (slowest rank per iteration); "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'mode':<16}{'time':>10}{'GB/s algbw':>12}{'staged':>10}")
    for det, name in ((False, "default"), (True, "deterministic")):
        share = staged[det] / chunks[det] if chunks[det] else 0.0
        print(f"{name:<16}{med[det] * 1e3:>8.1f}ms{size_bytes / med[det] / 1e9:>12.2f}"
              f"{share:>9.1%}")
    print(f"deterministic/default: {med[True] / med[False]:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "size": size_bytes, "iters": args.iters,
                       "times": {str(k): v for k, v in times.items()},
                       "staged": {str(k): v for k, v in staged.items()},
                       "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
