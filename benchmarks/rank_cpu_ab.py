#!/usr/bin/env python3
"""A rank's whole-process CPU per all-reduce, two builds paired (issue 33's rank CPU).

Each round runs benchmarks/allreduce.py once per tree -- a checkout with its own
native build, each run taking its package from its own tree (allreduce.py puts its
repository first on PYTHONPATH) -- and the trees' order alternates round by round, so
that a drift of the machine's load falls on both alike. A rank's CPU is its whole
process (utime + stime of every thread, benchmarks/allreduce_rank.py), per all-reduce,
averaged over the ranks; the ratio is taken per round against the first tree.

    # testbed, N=4 one per emulated host, 1 Gbit/s, MTU 1500 (as root), gloo beside
    python3 benchmarks/rank_cpu_ab.py --tree base=/tmp/main-build --tree new=. \\
        --rounds 6 --testbed --rate 1gbit --mtu 1500 --gloo
    # loopback, N=2, RoCE-sized chunks (no root)
    python3 benchmarks/rank_cpu_ab.py --tree base=/tmp/main-build --tree new=. \\
        --rounds 6 --np 2 --payload-bytes 1432

The record (--json, default benchmarks/results/issue33/rank_cpu_ab_UTC.json) keeps
every run, the load before and after it, and the medians with their spread.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import spread as _spread  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results", "issue33")


def _per_round(runs: List[Dict[str, Any]], rounds: int, name: str, key: str,
               ref: Callable[[Dict[str, Any]], Optional[float]]) -> List[float]:
    """Per round: tree ``name``'s ``key`` over the reference value ``ref`` takes from the
    first run of that round it gives one for (rounds missing either are left out)."""
    out = []
    for rnd in range(rounds):
        a = [v for v in (ref(r) for r in runs if r["round"] == rnd) if v]
        b = [r[key] for r in runs if r["round"] == rnd and r["tree"] == name]
        if a and b:
            out.append(b[0] / a[0])
    return out


def _commit(tree: str) -> str:
    r = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + ("+changes" if dirty else "")


def _one(tree: str, impls: str, args: argparse.Namespace) -> Dict[str, Any]:
    """One allreduce.py run from `tree`; its records by implementation."""
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        cmd = [sys.executable, os.path.join(tree, "benchmarks", "allreduce.py"), "--np",
               str(args.np), "--impls", impls, "--min-size", args.size, "--max-size", args.size,
               "--min-iters", str(args.iters), "--max-iters", str(args.iters), "--json", tmp.name]
        if args.testbed:
            cmd += ["--testbed", "--rate", args.rate, "--mtu", str(args.mtu),
                    "--testbed-name", args.testbed_name, "--subnet", args.subnet]
        if args.payload_bytes:
            cmd += ["--switch-args", f"--payload-bytes {args.payload_bytes}"]
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the tree's own package only
        load0 = os.getloadavg()[0]
        subprocess.run(cmd, cwd=tree, env=env, check=True, timeout=args.timeout,
                       stdout=subprocess.DEVNULL)
        with open(tmp.name) as f:
            recs = {r["impl"]: r for r in json.load(f)["records"]}
    out: Dict[str, Any] = {}
    for impl, r in recs.items():
        out[impl] = {"rank_cpu_ms": r["cpu_s_per_allreduce"] * 1e3, "time_ms": r["time_s"] * 1e3,
                     "correct": r["correct"], "waits_per_rank": r.get("waits_per_rank"),
                     "retransmits_per_rank": r.get("retransmits_per_rank"),
                     "naps_per_rank": r.get("naps_per_rank"), "nap_offs_per_rank": r.get("nap_offs_per_rank")}
    out["load"] = [load0, os.getloadavg()[0]]
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True,
                    help="NAME=PATH of a checkout with its native build; the first is the base")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=6, help="timed all-reduces per run")
    ap.add_argument("--testbed", action="store_true", help="one emulated host per rank (root)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--mtu", type=int, default=1500)
    # a testbed of its own (allreduce.py replaces one of the same name)
    ap.add_argument("--testbed-name", default="rcab")
    ap.add_argument("--subnet", default="10.83.7.0/24")
    ap.add_argument("--payload-bytes", type=int, default=0,
                    help="the aggregator's payload (loopback: 1432 = MTU 1500's)")
    ap.add_argument("--gloo", action="store_true",
                    help="a gloo run beside each round's (from the base tree): the ratio to gloo")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    trees = [t.split("=", 1) for t in args.tree]
    names = [n for n, _ in trees]
    runs: List[Dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = trees if rnd % 2 == 0 else trees[::-1]
        for name, path in order:
            impls = "netreduce,gloo" if args.gloo and name == names[0] else "netreduce"
            rec = _one(os.path.abspath(path), impls, args)
            nr = rec["netreduce"]
            runs.append({"round": rnd, "tree": name, **nr, "load": rec["load"],
                         "gloo_rank_cpu_ms": rec.get("gloo", {}).get("rank_cpu_ms"),
                         "gloo_time_ms": rec.get("gloo", {}).get("time_ms")})
            print(f"round {rnd} {name:>8}: rank CPU {nr['rank_cpu_ms']:.1f} ms, time "
                  f"{nr['time_ms']:.1f} ms, waits {nr['waits_per_rank']}, resends "
                  f"{nr['retransmits_per_rank']}, naps {nr['naps_per_rank']} (off {nr['nap_offs_per_rank']}), "
                  f"correct {nr['correct']}"
                  + (f"; gloo {runs[-1]['gloo_rank_cpu_ms']:.1f} ms" if runs[-1]["gloo_rank_cpu_ms"]
                     else "") + f"; load {rec['load'][0]:.1f}", flush=True)
    summary: Dict[str, Any] = {}
    base = names[0]
    for name in names:
        mine = [r for r in runs if r["tree"] == name]
        s = {"rank_cpu_ms": _spread([r["rank_cpu_ms"] for r in mine]),
             "time_ms": _spread([r["time_ms"] for r in mine]),
             "all_correct": all(r["correct"] for r in mine)}
        if name != base:
            ratios = _per_round(runs, args.rounds, name, "rank_cpu_ms",
                                lambda r: r["rank_cpu_ms"] if r["tree"] == base else None)
            s["cpu_ratio_to_" + base] = _spread(ratios)
            s["rounds_below_" + base] = sum(1 for x in ratios if x < 1)
        gl = [r["gloo_rank_cpu_ms"] for r in runs if r["gloo_rank_cpu_ms"]]
        if gl:
            s["cpu_ratio_to_gloo"] = _spread(_per_round(runs, args.rounds, name, "rank_cpu_ms",
                                                        lambda r: r["gloo_rank_cpu_ms"]))
            # the all-reduce's time against gloo's in the same round
            tper = _per_round(runs, args.rounds, name, "time_ms", lambda r: r.get("gloo_time_ms"))
            if tper:
                s["time_ratio_to_gloo"] = _spread(tper)
        summary[name] = s
    summary["gloo_rank_cpu_ms"] = _spread([r["gloo_rank_cpu_ms"] for r in runs if r["gloo_rank_cpu_ms"]])
    summary["load"] = _spread([x for r in runs for x in r["load"]])
    path = args.json or os.path.join(OUT, time.strftime("rank_cpu_ab_%Y%m%dT%H%M%SZ.json", time.gmtime()))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"command": "python3 benchmarks/rank_cpu_ab.py " + " ".join(sys.argv[1:] if argv is None else argv),
                   "trees": {n: {"path": p, "commit": _commit(p)} for n, p in trees},
                   "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "summary": summary, "runs": runs}, f, indent=1)
    print(json.dumps(summary, indent=1))
    print("record:", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
