#!/usr/bin/env python3
"""The distribution of needless resends over many runs of one all-reduce benchmark
(issue 33: the intermittent bursts under multicast fan-out at MTU 1500, CPU-bound).

    # as root: 12 runs of linerate.py cost's point (N=4, 64 MiB, 6 all-reduces, the
    # testbed unshaped so that only the CPUs limit it), daemon defaults
    PYTHONPATH=. python3 benchmarks/resend_bursts.py --runs 12 \\
        --json benchmarks/results/issue33/resend_bursts_after.json
    # A/B against other builds: each --pythonpath names a built checkout (a variant
    # named by its path); each run goes through every variant, the order rotating
    # from run to run so that none always runs first
    PYTHONPATH=. python3 benchmarks/resend_bursts.py --runs 12 --pythonpath /work/main \\
        --json benchmarks/results/issue33/resend_bursts_ab.json

Per run and rank it keeps the engine's counters over the timed all-reduces: which rule
resent (overtaken, next expected, tail probe, timeout), how many proved needless,
how many results came through the group; and each namespace's kernel counters over
the run (UDP receive-buffer overflows, softnet backlog drops and squeezes), which say
whether a packet was lost or only late. Every record carries the load average beside
it. A burst shows in about one run of 3-4 at load 5-10 and rarely below (the pauses
of a descheduled aggregator set it off): compare at ≥ 8 runs per variant.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if REPO not in sys.path:
    sys.path.append(REPO)

import linerate  # noqa: E402

ENGINE_KEYS = ("retransmits", "fast_retransmits", "overtaken_resends", "gap_resends", "tail_probes",
               "timeout_probes", "spurious_retransmits", "needless_by_repeat",
               "group_datagrams", "packets_received", "ignored_results", "waits")


def nstat(netns: str) -> Dict[str, int]:
    """The namespace's UDP and IP counters (absolute values)."""
    out = subprocess.run(["ip", "netns", "exec", netns, "nstat", "-az", "--json"],
                         capture_output=True, text=True, check=False).stdout
    try:
        kernel = json.loads(out).get("kernel", {})
    except ValueError:
        return {}
    keep = ("UdpRcvbufErrors", "UdpInErrors", "UdpInDatagrams", "UdpSndbufErrors", "IpInDiscards",
            "UdpInCsumErrors", "IpExtInNoRoutes")
    return {k: int(kernel.get(k, 0)) for k in keep}


def softnet() -> List[int]:
    """Summed over CPUs: processed, dropped (backlog full), time_squeeze."""
    tot = [0, 0, 0]
    with open("/proc/net/softnet_stat") as f:
        for line in f:
            v = [int(x, 16) for x in line.split()]
            for i in range(3):
                tot[i] += v[i]
    return tot


def one_run(tb, args, variant: str, env: Dict[str, str]) -> dict:
    nodes = [n.netns for n in tb.plan.nodes]
    k0 = {ns: nstat(ns) for ns in nodes}
    s0 = softnet()
    rec = linerate.cost_point(tb, args, 1500 if args.mtu == 1500 else args.mtu, variant, env)
    s1 = softnet()
    k1 = {ns: nstat(ns) for ns in nodes}
    rec["kernel"] = {ns: {k: k1[ns].get(k, 0) - k0[ns].get(k, 0) for k in k1[ns]} for ns in nodes}
    rec["softnet"] = {"processed": s1[0] - s0[0], "dropped": s1[1] - s0[1], "squeezed": s1[2] - s0[2]}
    rec["ranks"] = [{k: s.get(k, 0) for k in ENGINE_KEYS} for s in rec["rank_stats"]]
    for r, end in zip(rec["ranks"], rec.get("rank_stats_end", [])):
        r.update({k: end.get(k, 0) for k in ("srtt_us", "rto_us")})
    return rec


def summary(recs: List[dict]) -> dict:
    per_rank = [r["retransmits"] for rec in recs for r in rec["ranks"]]
    needless = [r["spurious_retransmits"] for rec in recs for r in rec["ranks"]]
    per_run = [max(r["retransmits"] for r in rec["ranks"]) for rec in recs]
    ms = [round(rec["time_per_allreduce_s"] * 1e3, 1) for rec in recs]
    return {"runs": len(recs), "resends_per_rank": sorted(per_rank),
            "max_rank_per_run": per_run, "median_per_rank": statistics.median(per_rank),
            "needless_per_rank_median": statistics.median(needless), "needless_per_rank_max": max(needless),
            "runs_with_a_rank_over_100": sum(1 for v in per_run if v > 100),
            "ms_per_allreduce": ms, "ms_median": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms),
            "load": [round(rec["loadavg"][0], 1) for rec in recs],
            "all_correct": all(rec["correct"] for rec in recs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--switch-args", default="", help="more netreduce-switch options")
    ap.add_argument("--switch-env", default="")
    ap.add_argument("--pythonpath", action="append", default=[],
                    help="another checkout (built) to compare with this one (repeatable)")
    ap.add_argument("--testbed-name", default="rsb")
    ap.add_argument("--subnet", default="10.83.7.0/24")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.ranks_without_net_admin = False
    from netreduce.testbed import Testbed
    variants = [("this", {})] + [(p, {"PYTHONPATH": p}) for p in args.pythonpath]
    recs: Dict[str, List[dict]] = {v: [] for v, _ in variants}
    load = []
    with Testbed(hosts=args.np, rate="10gbit", mtu=args.mtu, name=args.testbed_name,
                 subnet=args.subnet, replace=True) as tb:
        linerate.unshape(tb)
        for i in range(args.runs):
            for name, env in variants[i % len(variants):] + variants[:i % len(variants)]:
                load.append(os.getloadavg()[0])
                rec = one_run(tb, args, name, env)
                recs[name].append(rec)
                ranks = rec["ranks"]
                print(f"run {i} {name}: resends/rank {[r['retransmits'] for r in ranks]} "
                      f"fast {[r['fast_retransmits'] for r in ranks]} "
                      f"timeout {[r['timeout_probes'] for r in ranks]} "
                      f"overtaken {[r['overtaken_resends'] for r in ranks]} "
                      f"gap {[r['gap_resends'] for r in ranks]} "
                      f"spurious {[r['spurious_retransmits'] for r in ranks]} "
                      f"rcvbuf {[k.get('UdpRcvbufErrors', 0) for k in rec['kernel'].values()]} "
                      f"softnet {rec['softnet']} {rec['time_per_allreduce_s'] * 1e3:.0f} ms "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    out = {"command": "python3 benchmarks/resend_bursts.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "loadavg_before_runs": load,
           "summary": {name: summary(r) for name, r in recs.items()},
           "records": recs}
    print(json.dumps(out["summary"], indent=1))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
