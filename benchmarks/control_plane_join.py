"""benchmarks/control_plane.py ``join``: ``--ranks`` rank threads in ``--procs``
processes do what ``nr.init()`` does (admission, the engine, the hello) and their
first all-reduce against one real netreduce-switch; ``--before`` interleaves an earlier
checkout's runs."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List

from common import commit_of, pid_cpu_seconds
from control_plane_daemon import spawn_switch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "control_plane.py")  # the workers' command line


def worker_join(args: argparse.Namespace) -> None:
    """``--count`` rank threads from ``--first``: admission, hello, one all-reduce.
    Prints one JSON line: per-phase timestamps (time.time(), comparable across the
    processes of one host) and the engines' counters summed."""
    import resource
    import threading

    import numpy as np

    from netreduce.worker import dataplane
    from netreduce.worker.negotiation import NegotiationClient
    host, port = args.switch.rsplit(":", 1)
    address = (host, int(port))
    n = args.size
    go = threading.Event()
    t = {k: [0.0] * args.count for k in ("start", "admitted", "joined", "done")}
    stats: List[Dict[str, int]] = [{} for _ in range(args.count)]
    errors: List[str] = []

    def rank(i: int) -> None:
        r = args.first + i
        go.wait()
        try:
            t["start"][i] = time.time()
            dp = dataplane.connect(address, args.job, r, n, timeout=120.0)
            t["admitted"][i] = time.time()
            neg = None if args.no_hello else NegotiationClient(
                address, args.job, r, n, threshold=64 << 20, capacity=1024,
                start_timeout=120.0, timeout=120.0, agree=True)
            t["joined"][i] = time.time()
            x = np.full(16, r, np.int32)
            dp.allreduce(x)
            t["done"][i] = time.time()
            if not (x == n * (n - 1) // 2).all():
                errors.append(f"rank {r}: wrong sum {x[:4]}")
            stats[i] = dp.stats()
        except Exception as exc:  # reported to the driver, which fails the run
            errors.append(f"rank {r}: {exc!r}")
            return
        leave.wait()
        if neg is not None:
            neg.close()
        dp.close()

    leave = threading.Event()  # set once every process has reported: no rank leaves early
    threads = [threading.Thread(target=rank, args=(i,), daemon=True) for i in range(args.count)]
    for th in threads:
        th.start()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    go.set()
    while not errors and not all(t["done"]):
        time.sleep(0.005)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    keys = sorted({k for st in stats for k in st})
    print(json.dumps({
        "first": args.first, "count": args.count, "errors": errors[:10], "n_errors": len(errors),
        "times": t, "stats": {k: sum(st.get(k, 0) for st in stats) for k in keys},
        "max_retransmits": max((st.get("retransmits", 0) for st in stats), default=0),
        # per rank: the engine's first round-trip sample as measured (before its cap;
        # usually the held notice's), and its resends
        "first_rtt_us": [st.get("first_rtt_us", 0) for st in stats],
        "rank_retransmits": [st.get("retransmits", 0) for st in stats],
        "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)}),
        flush=True)
    sys.stdin.readline()  # the driver: every process has its results
    leave.set()
    for th in threads:
        th.join(30)


def drive_join(args: argparse.Namespace) -> None:
    """--repeat runs of this checkout (``after``) and, with --before, interleaved
    runs of the earlier checkout too, so that both see the same load."""
    codes = {"after": args.code or REPO}
    if args.before:
        codes = {"before": args.before, **codes}
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in codes}
    for _ in range(args.repeat):
        for name, code in codes.items():
            runs[name].append(_join_once(args, code))
            print(json.dumps(dict(runs[name][-1], variant=name)), flush=True)
    keys = ("join_s", "admission_s", "hello_after_admission_s", "hello_spread_s",
            "first_allreduce_s", "first_allreduce_slowest_rank_s", "resends_per_rank")
    summary = {name: {k: {"median": round(statistics.median(r[k] for r in rs), 4),
                          "min": min(r[k] for r in rs), "max": max(r[k] for r in rs)}
                      for k in keys} for name, rs in runs.items()}
    print(json.dumps({"summary": summary}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python3 benchmarks/control_plane.py " + " ".join(sys.argv[1:]),
                       "summary": summary, "runs": runs}, f, indent=1)


def _join_once(args: argparse.Namespace, code: str) -> Dict[str, Any]:
    load0 = os.getloadavg()
    proc, addr = spawn_switch(code, *args.switch_args.split())
    job = "join-" + uuid.uuid4().hex[:6]
    per = [args.ranks // args.procs + (1 if i < args.ranks % args.procs else 0)
           for i in range(args.procs)]
    firsts = [sum(per[:i]) for i in range(args.procs)]
    cpu_d0 = pid_cpu_seconds(proc.pid)
    workers = [subprocess.Popen(
        [sys.executable, SCRIPT, "worker-join", "--switch", addr, "--job", job,
         "--size", str(args.ranks), "--first", str(f), "--count", str(c)]
        + (["--no-hello"] if args.no_hello else []),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=code, **dict(e.split("=", 1) for e in args.env)))
        for f, c in zip(firsts, per)]
    outs = []
    try:
        for w in workers:
            line = w.stdout.readline()
            if not line:
                raise RuntimeError(f"a worker exited (rc {w.wait()}) without its report")
            outs.append(json.loads(line))
        cpu_daemon = pid_cpu_seconds(proc.pid) - cpu_d0
        for w in workers:
            w.stdin.write("leave\n")
            w.stdin.flush()
        for w in workers:
            w.wait(60)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        proc.terminate()
        proc.wait()
    errors = [e for o in outs for e in o["errors"]]
    if errors:
        raise RuntimeError(f"{sum(o['n_errors'] for o in outs)} ranks failed: {errors[:5]}")
    times = {k: [v for o in outs for v in o["times"][k]] for k in outs[0]["times"]}
    stats: Dict[str, int] = {}
    for o in outs:
        for k, v in o["stats"].items():
            stats[k] = stats.get(k, 0) + v
    t0 = min(times["start"])
    return {
        "ranks": args.ranks, "procs": args.procs,
        # the full join: first connection to the last hello returning
        "join_s": round(max(times["joined"]) - t0, 3),
        "admission_s": round(max(times["admitted"]) - t0, 3),
        "hello_after_admission_s": round(max(times["joined"]) - max(times["admitted"]), 3),
        # the first all-reduce: the last hello returning to the last result
        "first_allreduce_s": round(max(times["done"]) - max(times["joined"]), 3),
        # the first hello to return came this long before the last one
        "hello_spread_s": round(max(times["joined"]) - min(times["joined"]), 3),
        "hello_spread_per_process_s": [round(max(o["times"]["joined"]) - min(o["times"]["joined"]),
                                             3) for o in outs],
        "hello_first_per_process_s": [round(min(o["times"]["joined"]) - t0, 3) for o in outs],
        "first_allreduce_slowest_rank_s": round(max(d - j for d, j in zip(times["done"],
                                                                          times["joined"])), 3),
        "resends": stats.get("retransmits", 0),
        "resends_per_rank": round(stats.get("retransmits", 0) / args.ranks, 3),
        "max_resends_one_rank": max(o["max_retransmits"] for o in outs),
        "ranks_that_resent": sum(1 for o in outs for n in o.get("rank_retransmits", []) if n),
        # the first answer's round trip per rank (a held notice for all but the last
        # rank): what a timer before the first sample has to outwait (engines that
        # report first_rtt_us only)
        "first_rtt_ms": _percentiles([v / 1e3 for o in outs for v in o.get("first_rtt_us", [])
                                      if v]),
        "engine": {k: stats[k] for k in ("fast_retransmits", "timeout_probes", "tail_probes",
                                         "held_notices", "held_probes", "spurious_retransmits",
                                         "packets_sent", "packets_received", "ignored_results")
                   if k in stats},
        "cpu_s": {"ranks": round(sum(o["cpu_s"] for o in outs), 2),
                  "daemon": round(cpu_daemon, 2)},
        "load": [round(x, 2) for x in load0 + os.getloadavg()],
        "commit": commit_of(code), "code": code, "env": args.env,
        "switch_args": args.switch_args,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _percentiles(vals: List[float]) -> Dict[str, float]:
    if not vals:
        return {}
    vals = sorted(vals)
    at = lambda q: round(vals[min(len(vals) - 1, int(q * len(vals)))], 2)  # noqa: E731
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(vals[-1], 2),
            "over_2.5ms": sum(v > 2.5 for v in vals), "over_25ms": sum(v > 25 for v in vals),
            "n": len(vals)}
