#!/usr/bin/env python3
"""The blocking call's own cost through netreduce/algorithms/serial.py (hierarchical's
and failover's allreduce, the one-host 4 KiB path included) against the plain lock it
replaced: CPU (process_time) per call of an empty function, medians of --runs rounds
of --calls calls each, the two alternated.

    python3 benchmarks/serial_call.py --runs 7 --calls 100000
    # record: benchmarks/results/issue33/serial_call_UTC.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from netreduce.algorithms.serial import Serial  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    serial, lock = Serial("bench"), threading.Lock()

    def body() -> None:
        pass

    def locked() -> None:
        with lock:
            body()

    def through_serial() -> None:
        serial.call(lambda: body())

    us = {"lock": [], "serial": []}
    load = [os.getloadavg()[0]]
    for _ in range(args.runs):
        for name, fn in (("lock", locked), ("serial", through_serial)):
            t = time.process_time()
            for _ in range(args.calls):
                fn()
            us[name].append((time.process_time() - t) / args.calls * 1e6)
    load.append(os.getloadavg()[0])
    summary = {k: {"median_us": round(statistics.median(v), 3), "min": round(min(v), 3),
                   "max": round(max(v), 3)} for k, v in us.items()}
    utc = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.out or os.path.join(ROOT, "benchmarks", "results", "issue33",
                                    f"serial_call_{utc}.json")
    with open(path, "w") as f:
        json.dump({"command": "python3 benchmarks/serial_call.py " + " ".join(sys.argv[1:]),
                   "utc": utc, "load_1min": load, "summary": summary, "runs_us": us}, f, indent=1)
    print(json.dumps(summary), f"load {load}", f"# wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
