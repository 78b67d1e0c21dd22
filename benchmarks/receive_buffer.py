#!/usr/bin/env python3
"""Ranks whose UDP receive buffer the kernel caps (issue 19, found while measuring line
rate): one netreduce-switch with CAP_NET_ADMIN on loopback, N rank processes that
all-reduce S bytes of float32 --iters times, each run either with CAP_NET_ADMIN (their
SO_RCVBUFFORCE holds 32 MiB) or without it (util-linux setpriv drops it: SO_RCVBUF stops
at net.core.rmem_max), in alternation. net.core.rmem_max is set to --rmem-max
(212,992 B: Debian's and the kernel's default) for the run and put back after.
--window sets NETREDUCE_WINDOW on the capped ranks (0: the job's own choice).

    sudo PYTHONPATH=. python3 benchmarks/receive_buffer.py --np 4 --size 64M --rounds 3 \\
        --json benchmarks/results/receive_buffer.json

Reported per run: the median all-reduce time over the ranks' medians, the window the
engines ran with, their retransmissions, and whether each rank logged the warning.
Timings depend on a quiet machine: the record carries the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import common  # noqa: E402

RANK = """
import json, sys, time
import numpy as np
from netreduce.worker import dataplane
host, port, job, rank, size, count, iters = sys.argv[1:8]
rank, size, count, iters = int(rank), int(size), int(count), int(iters)
conn = dataplane.connect((host, int(port)), job, rank, size, timeout=120.0)
x = np.full(count, rank + 1, dtype=np.float32)
out = np.empty_like(x)
conn.allreduce(x, out)
times = []
for _ in range(iters):
    t = time.perf_counter()
    conn.allreduce(x, out)
    times.append(time.perf_counter() - t)
assert np.all(out == size * (size + 1) / 2), "wrong sum"
stats = conn._engine.stats()
print(json.dumps({"rank": rank, "median_ms": sorted(times)[len(times) // 2] * 1e3,
                  "window": getattr(conn, "window", conn.slots), "slots": conn.slots,
                  "receive_buffer": getattr(conn._engine, "receive_buffer_bytes", 0),
                  "retransmits": stats.get("retransmits", 0),
                  "fast_retransmits": stats.get("fast_retransmits", 0)}))
conn.close()
"""


def _size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def _job(address, mode: str, args) -> dict:
    job = "rb-" + uuid.uuid4().hex[:8]
    capped = mode != "cap"
    env = dict(os.environ, PYTHONPATH=REPO)
    if capped and args.window:
        env["NETREDUCE_WINDOW"] = str(args.window)
    count = _size(args.size) // 4
    procs = [subprocess.Popen((common.NO_NET_ADMIN if capped else []) +
                              [sys.executable, "-c", RANK, address[0], str(address[1]), job,
                               str(r), str(args.np), str(count), str(args.iters)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(args.np)]
    outs = [p.communicate(timeout=args.timeout) for p in procs]
    for p, (out, err) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"a rank failed ({mode}):\n{err[-2000:]}")
    rows = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    return {"mode": mode, "median_ms": statistics.median(r["median_ms"] for r in rows),
            "window": rows[0]["window"], "slots": rows[0]["slots"],
            "receive_buffer": rows[0]["receive_buffer"],
            "retransmits_per_rank": statistics.median(r["retransmits"] for r in rows),
            "warned_ranks": sum("UDP receive buffer" in err for _, err in outs),
            "load": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--size", default="64M", help="bytes per all-reduce (float32)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rmem-max", type=int, default=212992)
    ap.add_argument("--window", type=int, default=0, help="NETREDUCE_WINDOW of the capped ranks")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    sys.path.insert(0, REPO)
    from netreduce.switch import spawn

    runs = []
    with common.rmem_max_set(args.rmem_max):
        switch = spawn(host="127.0.0.1", port=0)
        try:
            for r in range(args.rounds):
                for mode in ("cap", "nocap"):
                    row = _job(switch.address, mode, args)
                    row["round"] = r
                    runs.append(row)
                    print(f"  [{mode} round {r}] {row['median_ms']:.1f} ms  window {row['window']} "
                          f"of {row['slots']}  receive buffer {row['receive_buffer']}  "
                          f"retransmits/rank {row['retransmits_per_rank']}  warned "
                          f"{row['warned_ranks']}/{args.np}  load {row['load']:.2f}", flush=True)
        finally:
            switch.stop()
    summary = {m: statistics.median(x["median_ms"] for x in runs if x["mode"] == m)
               for m in ("cap", "nocap")}
    print(f"# medians: with CAP_NET_ADMIN {summary['cap']:.1f} ms, without "
          f"{summary['nocap']:.1f} ms ({summary['nocap'] / summary['cap']:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "args": vars(args), "runs": runs, "medians_ms": summary}, f, indent=1)
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
