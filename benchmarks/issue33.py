#!/usr/bin/env python3
"""Issue 33's targets, one command each: the full side-by-side measurement, repeated
(medians of >= 5 runs with the spread, every ratio from one run), written as a raw
record under benchmarks/results/issue33/ so that it can be re-run in a quiet window.
Each subcommand drives the project's own benchmark for the target and keeps every
run's record; the summary is medians and (min, max) of the per-run ratios.

    # as root (the testbed): rank CPU per all-reduce vs a gloo rank, and time vs gloo,
    # N=4, 64 MiB, defaults; 1 and 40 Gbit/s, MTU 1500 and 9000
    python3 benchmarks/issue33.py testbed --runs 5
    # the aggregator: GB of worker input per CPU-second of the whole daemon process
    # (unshaped testbed, defaults), and the cores a 100 Gbit/s port needs
    python3 benchmarks/issue33.py aggregator --runs 5
    # 4 KiB public-API all-reduce on one host, N=4 and N=2 (defaults), and the data
    # plane alone beside it
    python3 benchmarks/issue33.py latency --runs 5
    # 1,000 ranks: the full join, then the first 16-element sum (and resends per rank)
    python3 benchmarks/issue33.py join --runs 5
    # all of them, one after the other
    python3 benchmarks/issue33.py all --runs 5

Targets (issue 33): rank CPU <= 0.5x a gloo rank's; MTU 1500 (and 9000) at 40 Gbit/s
<= 0.67x gloo's time; aggregator >= 3.1 GB/CPU-s at MTU 1500; 4 KiB <= 0.10 ms at
N=4 and <= 0.05 ms at N=2; 1,000 ranks: first sum <= 0.2 s, <= 0.1 resends per rank.
The training-step target has its own driver (benchmarks/train_testbed.py). Every
record carries the load average before and after each run: on a shared machine the
wall-time ratios are noisy, the CPU-seconds much less so.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT = os.path.join(HERE, "results", "issue33")
sys.path.insert(0, HERE)
from common import commit_of, spread as _spread  # noqa: E402


def _utc() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _run(cmd: List[str], timeout: float) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    print("#", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=REPO, env=env, timeout=timeout, check=True,
                   stdout=subprocess.DEVNULL)


def _write(name: str, args: argparse.Namespace, summary: Dict[str, Any], runs: Any) -> str:
    os.makedirs(OUT, exist_ok=True)
    path = args.out or os.path.join(OUT, f"{name}_{_utc()}.json")
    with open(path, "w") as f:
        json.dump({"command": "python3 benchmarks/issue33.py " + " ".join(sys.argv[1:]),
                   "commit": commit_of(REPO), "utc": _utc(), "summary": summary, "runs": runs}, f, indent=1)
    print(json.dumps(summary, indent=1))
    print(f"# wrote {path}")
    return path


# --- testbed: rank CPU and time against gloo -----------------------------------------
def _windows(args: argparse.Namespace) -> List[Optional[int]]:
    """--window: the NETREDUCE_WINDOW values to alternate (None: the default alone)."""
    return [int(w) for w in args.window.split(",")] if args.window else [None]


def _allreduce(args: argparse.Namespace, rate: str, mtu: int, impls: str,
               window: Optional[int]) -> Dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        _run([sys.executable, "benchmarks/allreduce.py", "--testbed", "--rate", rate,
              "--np", "4", "--impls", impls, "--min-size", args.size,
              "--max-size", args.size, "--min-iters", str(args.iters), "--mtu", str(mtu),
              "--json", tmp.name]
             + (["--switch-args", args.switch_args] if args.switch_args else [])
             + (["--nr-window", str(window)] if window is not None else []), timeout=1800)
        with open(tmp.name) as f:
            return {r["impl"]: r for r in json.load(f)["records"]}


def testbed(args: argparse.Namespace) -> str:
    runs: List[Dict[str, Any]] = []
    points = [(r, int(m)) for r in args.rates.split(",") for m in args.mtus.split(",")]
    windows = _windows(args)
    for i in range(args.runs):
        for rate, mtu in points:  # every point once per run: the same load for all
            load0 = os.getloadavg()
            # Several windows: netreduce once per window, in an order that turns each run
            # (no window always first), gloo once beside them for the ratios.
            turn = windows[i % len(windows):] + windows[:i % len(windows)]
            recs = {w: _allreduce(args, rate, mtu, "netreduce,gloo" if k == 0 else "netreduce", w)
                    for k, w in enumerate(turn)}
            gl = recs[turn[0]]["gloo"]
            for w in windows:
                nr = recs[w]["netreduce"]
                runs.append({
                    "run": i, "rate": rate, "mtu": mtu, "window": w,
                    "load": list(load0) + list(os.getloadavg()), "netreduce": nr, "gloo": gl,
                    "time_ratio": nr["time_s"] / gl["time_s"],
                    "cpu_ratio": nr["cpu_s_per_allreduce"] / gl["cpu_s_per_allreduce"]})
                label = "" if w is None else f" window {w}"
                print(f"  run {i} {rate} MTU {mtu}{label}: time {nr['time_s'] * 1e3:.1f} / "
                      f"{gl['time_s'] * 1e3:.1f} ms = {runs[-1]['time_ratio']:.3f}; rank CPU "
                      f"{nr['cpu_s_per_allreduce'] * 1e3:.1f} / {gl['cpu_s_per_allreduce'] * 1e3:.1f} "
                      f"ms = {runs[-1]['cpu_ratio']:.3f}; load {os.getloadavg()[0]:.1f}", flush=True)
    summary = {}
    for (rate, mtu), w in [(p, w) for p in points for w in windows]:
        mine = [r for r in runs if r["rate"] == rate and r["mtu"] == mtu and r["window"] == w]
        summary[f"{rate} mtu{mtu}" + ("" if w is None else f" window{w}")] = {
            "time_ratio": _spread([r["time_ratio"] for r in mine]),
            "cpu_ratio": _spread([r["cpu_ratio"] for r in mine]),
            "netreduce_ms": _spread([r["netreduce"]["time_s"] * 1e3 for r in mine]),
            "gloo_ms": _spread([r["gloo"]["time_s"] * 1e3 for r in mine]),
            "netreduce_rank_cpu_ms": _spread([r["netreduce"]["cpu_s_per_allreduce"] * 1e3
                                              for r in mine]),
            "gloo_rank_cpu_ms": _spread([r["gloo"]["cpu_s_per_allreduce"] * 1e3 for r in mine]),
            "load": _spread([r["load"][0] for r in mine])}
    return _write("testbed", args, summary, runs)


# --- aggregator: GB per CPU-second of the whole daemon --------------------------------
def aggregator(args: argparse.Namespace) -> str:
    windows = _windows(args)  # several: linerate's variants, alternated within each run
    variants = [] if windows == [None] else [f"window{w}:NETREDUCE_WINDOW={w}" for w in windows]
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        _run([sys.executable, "benchmarks/linerate.py", "cost", "--mtu", args.mtus, "--np", "4",
              "--size", args.size, "--iters", str(args.iters), "--repeats", str(args.runs),
              "--json", tmp.name] + (["--switch-args", args.switch_args] if args.switch_args else [])
             + [a for v in variants for a in ("--variant", v)], timeout=3600)
        with open(tmp.name) as f:
            data = json.load(f)
    runs = data["records"] if isinstance(data, dict) else data
    summary = {}
    keys = sorted({(r["mtu"], r.get("variant", "default")) for r in runs if "error" not in r})
    for mtu, variant in keys:
        mine = [r for r in runs if r.get("mtu") == mtu and r.get("variant", "default") == variant
                and "error" not in r]
        gbs = [r["aggregator_GB_per_cpu_s"] for r in mine]
        med = statistics.median(gbs)
        summary[f"mtu{mtu}" + ("" if variant == "default" else f" {variant}")] = {
            "aggregator_GB_per_cpu_s": _spread(gbs),
            "cores_per_100gbit_port": round(12.5 / med, 2),
            "engine_cpu_s_per_GB": _spread([r["engine_cpu_s_per_GB"] for r in mine]),
            "ms_per_allreduce": _spread([r["time_per_allreduce_s"] * 1e3 for r in mine]),
            "load": _spread([r["loadavg"][0] for r in mine])}
    return _write("aggregator", args, summary, runs)


# --- latency: 4 KiB public-API all-reduce ---------------------------------------------
def latency(args: argparse.Namespace) -> str:
    runs = {}
    for np_ in (4, 2):
        with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
            _run([sys.executable, "benchmarks/control_plane.py", "step", "--np", str(np_),
                  "--repeat", str(args.runs), "--variants", "agreement,dataplane",
                  "--cycles", "1", "--algorithms", "auto", "--json", tmp.name], timeout=3600)
            with open(tmp.name) as f:
                runs[f"np{np_}"] = json.load(f)
    summary = {k: {cell: _spread(v) for cell, v in r["results"].items()} for k, r in runs.items()}
    return _write("latency", args, summary, runs)


# --- join: 1,000 ranks, the first sum after the join ----------------------------------
def join(args: argparse.Namespace) -> str:
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        _run([sys.executable, "benchmarks/control_plane.py", "join", "--ranks", str(args.ranks),
              "--procs", "4", "--repeat", str(args.runs), "--json", tmp.name], timeout=3600)
        with open(tmp.name) as f:
            data = json.load(f)
    return _write("join", args, data["summary"], data["runs"])


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", choices=("testbed", "aggregator", "latency", "join", "all"))
    ap.add_argument("--runs", type=int, default=5, help="repeats (default 5)")
    ap.add_argument("--rates", default="1gbit,40gbit", help="testbed: link rates")
    ap.add_argument("--mtus", default="1500,9000", help="testbed, aggregator: MTUs")
    ap.add_argument("--size", default="64M", help="testbed, aggregator: all-reduce size")
    ap.add_argument("--iters", type=int, default=5, help="timed all-reduces per run")
    ap.add_argument("--ranks", type=int, default=1000, help="join: ranks")
    ap.add_argument("--switch-args", default="", help="extra netreduce-switch flags (default none)")
    ap.add_argument("--window", default="",
                    help="testbed, aggregator: NETREDUCE_WINDOW values to alternate within each "
                         "run, comma-separated (0 = all the slots), e.g. 0,256; unset: the default")
    ap.add_argument("--out", default="", help="record path (default results/issue33/TARGET_UTC.json)")
    args = ap.parse_args(argv)
    todo = ["testbed", "aggregator", "latency", "join"] if args.target == "all" else [args.target]
    for t in todo:
        {"testbed": testbed, "aggregator": aggregator, "latency": latency, "join": join}[t](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
