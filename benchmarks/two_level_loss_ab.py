"""Two levels under loss, two code trees paired: does the job finish, and how fast.

    sudo python3 benchmarks/two_level_loss_ab.py --code base=DIR --code fix=. \
        --loss 0.15 --runs 16 --json out.json

benchmarks/two_level.py's layout (2 racks x 2 hosts, a rack aggregator per rack, the
spine; 1 Gbit/s) with --loss UDP loss on every namespace's input (nftables). Each run
is one job of the tree in one tree's code (daemons and ranks alike), the trees
alternated a b b a ...; each rank runs two_level.RANK (the checked phase, then --iters
all-reduces of --size bytes, NETREDUCE_TIMEOUT --rank-timeout s). Per run: whether every
rank finished, the job's wall time, the slowest rank's median all-reduce, the racks'
uplink counters (as ranks 0 and 2 read them), and a failed run's rank errors (with the
counters each failing rank took at its aggregators). Issue 33, uplinkloss: a spine
result lost while the rack's partials wait on the other rack's share.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks import two_level as T  # noqa: E402
from benchmarks import tree_jobs  # noqa: E402
from benchmarks.common import parse_size, spread, stop, write_record  # noqa: E402
from netreduce.testbed import Testbed  # noqa: E402
from netreduce.testbed.two_level import two_level_plan  # noqa: E402

KEYS = ("uplink_partials_sent", "uplink_partials_resent", "uplink_repeat_resends",
        "uplink_dropped", "duplicates", "held_notices")


def once(tb: Testbed, code: str, size: int, iters: int, timeout_s: float) -> Dict:
    spine = tb.hosts[T.SPINE].address
    daemons = [tree_jobs.daemon(tb, tb.hosts[T.SPINE], [], code)] + \
        [tree_jobs.daemon(tb, tb.hosts[h], ["--spine", spine], code) for h in T.RACKS]
    job = "ul-" + uuid.uuid4().hex[:6]
    try:
        tree_jobs.wait_listening(tb, [tb.hosts[h].address for h in (T.SPINE, *T.RACKS)], code)
        t0 = time.monotonic()
        procs = []
        for r in range(T.RANKS):
            env = dict(os.environ, NETREDUCE_SWITCH=f"{spine}:4791", NETREDUCE_JOB=job,
                       NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(T.RANKS),
                       NETREDUCE_LOCAL_RANK="0", NETREDUCE_LOCAL_SIZE="1",
                       NETREDUCE_TIMEOUT=str(timeout_s), PYTHONPATH=code,
                       NETREDUCE_RACK_SWITCH=f"{tb.hosts[T.RACKS[r * 2 // T.RANKS]].address}:4791")
            procs.append(tb.popen(r, [sys.executable, "-c", T.RANK, str(size // 4), str(iters)],
                                  env=env, cwd=code, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True))
        ranks, errors = tree_jobs.collect(procs, 240, keep_err=6000)
        wall = time.monotonic() - t0
    finally:
        stop(daemons)
    return {"ok": not errors, "wall_s": wall,
            "median_s": max(r["median_s"] for r in ranks) if ranks else None,
            "racks": [{k: r["rack"].get(k, 0) for k in KEYS} for r in ranks if r.get("rack")],
            "errors": errors, "load": open("/proc/loadavg").read().split()[:3]}


def summarise(runs: List[Dict], names: List[str]) -> Dict[str, Dict]:
    """Per tree: runs, failed runs, and over the finished ones the spreads of the wall
    time, the slowest rank's median all-reduce and the racks' resend counters."""
    summary = {}
    for name in names:
        mine = [r for r in runs if r["arm"] == name]
        ok = [r for r in mine if r["ok"]]
        summary[name] = {
            "runs": len(mine), "failed": len(mine) - len(ok),
            "wall_s": spread(r["wall_s"] for r in ok),
            "median_allreduce_s": spread(r["median_s"] for r in ok),
            "load1": spread(float(r["load"][0]) for r in mine),
            **{k: spread(rc[k] for r in ok for rc in r["racks"]) for k in KEYS[:3]}}
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", action="append", required=True, metavar="NAME=DIR",
                    help="two trees, each built in place")
    ap.add_argument("--loss", type=float, default=0.15)
    ap.add_argument("--size", default="4M")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--rank-timeout", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=16, help="in all, over both trees")
    ap.add_argument("--name", default="ul1")
    ap.add_argument("--subnet", default="10.100.1.0/24")
    ap.add_argument("--json", default=None, help="write the raw record here")
    args = ap.parse_args()
    codes = [tuple(c.split("=", 1)) for c in args.code]
    if len(codes) != 2:
        ap.error("--code twice: NAME=DIR of each tree")
    codes = [(name, os.path.abspath(path)) for name, path in codes]
    size = parse_size(args.size)
    runs = []
    layout = two_level_plan(2, 2, "1gbit", name=args.name, subnet=args.subnet)
    with Testbed(plan=layout.plan, replace=True) as tb:
        if args.loss:
            tb.set_loss(args.loss, proto="udp")
        for i in range(args.runs):
            name, code = codes[(i + i // 2) % 2]  # a b b a a b ...
            rec = once(tb, code, size, args.iters, args.rank_timeout)
            rec.update(arm=name, run=i, utc=time.strftime("%H:%M:%S", time.gmtime()))
            runs.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "errors"}), flush=True)
    summary = summarise(runs, [name for name, _ in codes])
    for name, _ in codes:
        print(name, json.dumps(summary[name]))
    if args.json:
        write_record(args.json, dict(summary, loss=args.loss, size=size, iters=args.iters,
                                     rank_timeout_s=args.rank_timeout,
                                     codes=dict(codes)), runs)


if __name__ == "__main__":
    main()
