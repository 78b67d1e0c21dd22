"""Several aggregators on the emulated testbed: does throughput scale with k?

    sudo PYTHONPATH=. python3 benchmarks/multi_aggregator.py --np 3 --rate 200mbit \
        --size 16M --iters 3 --aggregators 1,2,3

A testbed of np + max(k) host namespaces, every link shaped to --rate. Ranks run in
hosts 0..np-1; the k netreduce-switch daemons run in the next k hosts, so each
aggregator sits behind a link of the same rate as a worker's: with one aggregator
its link carries np x S each way and is the bottleneck (np S / rate), with k they
share it (np S / (k rate), until the workers' own links, S / rate, bind). Ranks go
through the public API (NETREDUCE_SWITCH=a,b,...); time = slowest rank's mean over
the timed iterations after one checked warm-up. Wire bytes from the veth counters.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import parse_size, stop  # noqa: E402
from netreduce.testbed import Testbed  # noqa: E402
from netreduce.testbed.plan import parse_rate  # noqa: E402

RANK = r'''
import json, os, sys, time
import numpy as np
import netreduce as nr
nr.init()
n, iters = int(sys.argv[1]), int(sys.argv[2])
r, size = nr.rank(), nr.size()
x = np.full(n, float(r + 1), np.float32)
got = nr.allreduce(x, op=nr.Sum, name="warm")
assert np.all(got == size * (size + 1) / 2), "wrong sum"
times = []
for i in range(iters):
    t = time.perf_counter()
    nr.allreduce(x, op=nr.Sum, name=f"t{i}")
    times.append(time.perf_counter() - t)
print(json.dumps({"rank": r, "mean_s": sum(times) / len(times), "algorithm": nr.api._comm().dp.name}), flush=True)
nr.shutdown()
'''


def run_k(tb: Testbed, np_: int, k: int, size: int, iters: int, port: int) -> dict:
    daemons = []
    try:
        for i in range(k):
            node = tb.hosts[np_ + i]
            proc = tb.popen(node, [sys.executable, "-m", "netreduce.switch", "--host",
                                   node.address, "--port", str(port), "--allow-open-jobs"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if "listening on" in line or not line:
                    break
            daemons.append((node, proc))
        switch = ",".join(f"{node.address}:{port}" for node, _ in daemons)
        before = tb.counters()
        job = "ma-" + uuid.uuid4().hex[:6]
        ranks = []
        for r in range(np_):
            env = dict(os.environ, NETREDUCE_SWITCH=switch, NETREDUCE_JOB=job,
                       NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(np_), NETREDUCE_TIMEOUT="60",
                       PYTHONPATH=REPO)
            ranks.append(tb.popen(r, [sys.executable, "-c", RANK, str(size // 4), str(iters)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
        outs = []
        for p in ranks:
            out, err = p.communicate(timeout=1200)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"rank failed (rc {p.returncode}): {err[-2000:]}")
            outs.append(json.loads(lines[-1]))
        after = tb.counters()
        agg_rx = [after[node.name]["rx_bytes"] - before[node.name]["rx_bytes"] for node, _ in daemons]
        return {"aggregators": k, "time_s": max(o["mean_s"] for o in outs),
                "algorithm": outs[0]["algorithm"],
                "aggregator_rx_over_S": [round(b / size / (iters + 1), 3) for b in agg_rx]}
    finally:
        stop([proc for _, proc in daemons], 5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=3)
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--size", default="16M")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--aggregators", default="1,2,3")
    ap.add_argument("--name", default="nrma")
    ap.add_argument("--subnet", default="10.79.0.0/24")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ks = [int(k) for k in args.aggregators.split(",")]
    size = parse_size(args.size)
    load0 = os.getloadavg()
    rows = []
    with Testbed(hosts=args.np + max(ks), rate=args.rate, name=args.name,
                 subnet=args.subnet, replace=True) as tb:
        for k in ks:
            rows.append(run_k(tb, args.np, k, size, args.iters, 4791))
            print(json.dumps(rows[-1]), flush=True)
    rate = parse_rate(args.rate) / 8
    one = next((r["time_s"] for r in rows if r["aggregators"] == 1), None)
    print(f"\n{args.np} ranks, {args.size} float32, links {args.rate}; load {load0[0]:.1f} -> "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| aggregators | time s | speed-up vs 1 | bound np*S/(k*rate) s | rx per aggregator / S |")
    print("|---|---|---|---|---|")
    for r in rows:
        bound = max(args.np * size / (r["aggregators"] * rate), size / rate)
        print(f"| {r['aggregators']} | {r['time_s']:.3f} | "
              f"{(one / r['time_s']) if one else float('nan'):.2f}x | {bound:.3f} | "
              f"{', '.join(map(str, r['aggregator_rx_over_S']))} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "loadavg_start": load0, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
