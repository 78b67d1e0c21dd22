"""Loss recovery in the rank's engine, code trees paired: time per all-reduce and
resends per rank at nftables loss, flat and two-level (issue 33, lossprobe).

    sudo python3 benchmarks/lossprobe_ab.py --code main=DIR --code fix=. \
        --topology flat,two --loss 0,0.01,0.05 --size 64M,4M --runs 6 --json out.json

flat: N=4 hosts and one aggregator (netreduce.testbed's star); two: benchmarks/
two_level.py's layout (2 racks x 2 hosts, a rack aggregator per rack, the spine). Both
at 1 Gbit/s, UDP loss on every namespace's input. Each run is one job in one tree's
code (daemons and ranks alike), the trees alternated a b b a ... per cell; each rank
does one warm-up all-reduce, then --iters timed all-reduces of --size bytes (float32,
integer values, every element checked exactly against the sum every iteration).
Per run: the slowest rank's median and worst all-reduce, and each rank's resend
counters over the timed all-reduces (engine stats deltas).
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
from typing import Dict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks import tree_jobs  # noqa: E402
from benchmarks.common import parse_size, spread, stop, write_record  # noqa: E402
from netreduce.testbed import Testbed  # noqa: E402
from netreduce.testbed.two_level import two_level_plan  # noqa: E402

RANKS, RACKS, SPINE = 4, (4, 5), 6  # two-level: benchmarks/two_level.py's layout
COUNTERS = ("retransmits", "timeout_probes", "fast_retransmits", "overtaken_resends",
            "gap_resends", "tail_probes", "held_probes", "spurious_retransmits",
            "needless_by_repeat", "repaired_chunks", "repair_wait_us", "packets_sent",
            "probe_notices")

RANK = r'''
import json, os, sys, time
import numpy as np
import netreduce as nr
n, iters = int(sys.argv[1]), int(sys.argv[2])
keys = sys.argv[3].split(",")
nr.init()
size, r = nr.size(), nr.rank()
base = (np.arange(n) % 251).astype(np.float32)
x = base + np.float32(r + 1)
want = base * size + np.float32(size * (size + 1) // 2)
got = nr.allreduce(x, op=nr.Sum, name="warm")
assert np.array_equal(got, want), "warm-up sum inexact"
st0 = nr.api._comm().dp.stats()
times = []
exact = True
for i in range(iters):
    t = time.perf_counter()
    got = nr.allreduce(x, op=nr.Sum, name=f"t{i}")
    times.append(time.perf_counter() - t)
    exact = exact and bool(np.array_equal(got, want))
st = nr.api._comm().dp.stats()
print(json.dumps({"rank": r, "times": times, "exact": exact,
                  "d": {k: int(st.get(k, 0)) - int(st0.get(k, 0)) for k in keys},
                  "rto_us": st.get("rto_us"), "srtt_us": st.get("srtt_us")}), flush=True)
nr.shutdown()
'''


def once(tb: Testbed, topo: str, code: str, size: int, iters: int, timeout_s: float) -> Dict:
    if topo == "two":
        spine = tb.hosts[SPINE]
        nodes = [(spine, [])] + [(tb.hosts[h], ["--spine", spine.address]) for h in RACKS]
    else:
        spine = tb.aggregator
        nodes = [(spine, [])]
    daemons = [tree_jobs.daemon(tb, node, args, code) for node, args in nodes]
    job = "lp-" + uuid.uuid4().hex[:6]
    try:
        tree_jobs.wait_listening(tb, [node.address for node, _ in nodes], code)
        procs = []
        for r in range(RANKS):
            env = dict(os.environ, NETREDUCE_SWITCH=f"{spine.address}:4791", NETREDUCE_JOB=job,
                       NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(RANKS),
                       NETREDUCE_LOCAL_RANK="0", NETREDUCE_LOCAL_SIZE="1",
                       NETREDUCE_TIMEOUT=str(timeout_s), PYTHONPATH=code)
            if topo == "two":
                env["NETREDUCE_RACK_SWITCH"] = f"{tb.hosts[RACKS[r * 2 // RANKS]].address}:4791"
            procs.append(tb.popen(r, [sys.executable, "-c", RANK, str(size // 4), str(iters),
                                      ",".join(COUNTERS)],
                                  env=env, cwd=code, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True))
        ranks, errors = tree_jobs.collect(procs, 300, keep_err=3000)
    finally:
        stop(daemons)
    ok = not errors
    return {"ok": ok, "exact": ok and all(r["exact"] for r in ranks),
            "median_s": max(statistics.median(r["times"]) for r in ranks) if ok else None,
            "worst_s": max(max(r["times"]) for r in ranks) if ok else None,
            "per_rank": {k: [r["d"][k] for r in ranks] for k in COUNTERS},
            "rto_us": [r["rto_us"] for r in ranks], "errors": errors,
            "load": open("/proc/loadavg").read().split()[:3]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", action="append", required=True, metavar="NAME=DIR",
                    help="one or two trees, each built in place")
    ap.add_argument("--topology", default="flat,two")
    ap.add_argument("--loss", default="0,0.01,0.05")
    ap.add_argument("--size", default="64M,4M")
    ap.add_argument("--iters", default="64M=4,4M=8", help="timed all-reduces per size")
    ap.add_argument("--rank-timeout", type=float, default=60.0)
    ap.add_argument("--runs", type=int, default=6, help="per cell, over the trees")
    ap.add_argument("--name", default="lp1")
    ap.add_argument("--subnet", default="10.105.0.0/24")
    ap.add_argument("--json", default=None, help="write the raw record here")
    args = ap.parse_args()
    codes = [tuple(c.split("=", 1)) for c in args.code]
    codes = [(name, os.path.abspath(path)) for name, path in codes]
    iters = {parse_size(k): int(v) for k, v in (kv.split("=") for kv in args.iters.split(","))}
    runs = []
    for topo in args.topology.split(","):
        if topo == "two":
            plan = two_level_plan(2, 2, "1gbit", name=args.name, subnet=args.subnet).plan
            tb = Testbed(plan=plan, replace=True)
        else:
            tb = Testbed(hosts=RANKS, rate="1gbit", name=args.name, subnet=args.subnet, replace=True)
        with tb:
            for loss in (float(x) for x in args.loss.split(",")):
                tb.set_loss(loss, proto="udp")
                for size in (parse_size(s) for s in args.size.split(",")):
                    for i in range(args.runs):
                        name, code = codes[(i + i // 2) % len(codes)]  # a b b a a b ...
                        rec = once(tb, topo, code, size, iters[size], args.rank_timeout)
                        rec.update(arm=name, topo=topo, loss=loss, size=size, run=i,
                                   utc=time.strftime("%H:%M:%S", time.gmtime()))
                        runs.append(rec)
                        print(json.dumps({k: v for k, v in rec.items() if k != "errors"}), flush=True)
                        if rec["errors"]:
                            print(rec["errors"][0][-800:], file=sys.stderr, flush=True)
    summary = {}
    for r in runs:
        key = f"{r['topo']} {r['size'] >> 20}M loss {r['loss']:g} {r['arm']}"
        summary.setdefault(key, []).append(r)
    table = {}
    for key, rs in summary.items():
        ok = [r for r in rs if r["ok"]]
        table[key] = {"runs": len(rs), "failed": len(rs) - len(ok),
                      "inexact": sum(1 for r in ok if not r["exact"]),
                      "median_s": spread(r["median_s"] for r in ok),
                      "worst_s": spread(r["worst_s"] for r in ok),
                      "load1": spread(float(r["load"][0]) for r in rs),
                      **{k: spread(v for r in ok for v in r["per_rank"][k])
                         for k in ("retransmits", "timeout_probes", "fast_retransmits", "held_probes")}}
        print(key, json.dumps(table[key]), flush=True)
    if args.json:
        write_record(args.json, dict(table=table, codes=dict(codes), args=vars(args)), runs)


if __name__ == "__main__":
    main()
