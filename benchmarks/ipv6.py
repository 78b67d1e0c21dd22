"""IPv4 against IPv6 on loopback, same run: one netreduce-switch on "::" (dual-stack),
N rank processes that reach it as 127.0.0.1 in one job and as ::1 in the next, and
a second daemon on 127.0.0.1 only (an AF_INET socket, as before IPv6), alternating,
each job timing REPS all-reduces of SIZE MiB of float32.
Defaults: no payload flag (the jumbo extension: 65464 B over IPv4, 65448 B over
IPv6), or --payload-bytes 4096 for RoCE-sized, ICRC-checked packets.

    python3 benchmarks/ipv6.py [--ranks 2] [--mib 64] [--reps 10] [--rounds 3]
                               [--payload-bytes 4096]

Prints per case the median seconds per all-reduce (the slowest rank's median of
REPS, then the median over ROUNDS) and the ratios."""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid

import numpy as np

from netreduce.worker import dataplane
from netreduce.switch import spawn


def _rank(rank, size, address, job, count, reps, q):
    try:
        with dataplane.connect(address, job, rank, size, timeout=120.0) as conn:
            a = np.ones(count, np.float32)
            conn.allreduce(a)  # warm-up: admission, payload, first round trips
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                conn.allreduce(a)
                times.append(time.perf_counter() - t0)
            q.put((rank, statistics.median(times), conn.stats()["payload_bytes"]))
    except Exception as exc:  # report, never hang the parent
        q.put((rank, None, repr(exc)))


def run_job(address, size, count, reps):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    job = "bench6-" + uuid.uuid4().hex[:6]
    procs = [ctx.Process(target=_rank, args=(r, size, address, job, count, reps, q))
             for r in range(size)]
    for p in procs:
        p.start()
    out = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(10)
    bad = [o for o in out if o[1] is None]
    if bad:
        raise SystemExit(f"rank failed: {bad}")
    return max(o[1] for o in out), out[0][2]  # the slowest rank's median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mib", type=float, default=64)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--payload-bytes", type=int, default=None)
    ap.add_argument("--json", default="", help="also write the record (every round) here")
    args = ap.parse_args()
    load0, started = list(os.getloadavg()), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    count = int(args.mib * 2**20) // 4
    opts = {} if args.payload_bytes is None else {"payload_bytes": args.payload_bytes}
    results = {"ipv4_only_daemon": [], "ipv4": [], "ipv6": []}
    payloads = {}
    # "::" is beyond loopback, and these ranks bring no secret: --allow-open-jobs
    with spawn(host="::", port=0, extra_args=["--allow-open-jobs"], **opts) as sw, \
            spawn(host="127.0.0.1", port=0, **opts) as sw4:
        port = sw.address[1]
        for _ in range(args.rounds):
            for family, address in (("ipv4_only_daemon", sw4.address), ("ipv4", ("127.0.0.1", port)),
                                    ("ipv6", ("::1", port))):
                t, payload = run_job(address, args.ranks, count, args.reps)
                results[family].append(t)
                payloads[family] = payload
    med = {f: statistics.median(v) for f, v in results.items()}
    record = {"command": "python3 benchmarks/ipv6.py " + " ".join(sys.argv[1:]),
              "utc_start": started, "load_start": load0, "load_end": list(os.getloadavg()),
              "ranks": args.ranks, "mib": args.mib, "reps": args.reps,
              "payload_bytes": payloads, "median_s": med,
              "gbit_s": {f: args.mib * 8 * 2**20 / 1e9 / t for f, t in med.items()},
              "ipv6_over_ipv4_time": med["ipv6"] / med["ipv4"],
              "dual_stack_ipv4_over_ipv4_only_time": med["ipv4"] / med["ipv4_only_daemon"],
              "rounds": results}
    print(json.dumps(record, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
