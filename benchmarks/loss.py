#!/usr/bin/env python3
"""Loss-recovery benchmark (issue 14): N ranks run the same seeded stream of
all-reduces of random sizes, dtypes and ops; the time of the run is measured at
several loss rates, each result checked bit for bit against the numpy reference
and across ranks (a digest of every result).

Loopback, loss by the engine's drop knob (NETREDUCE_DROP_RATE), this checkout
against an older build side by side (its tree on PYTHONPATH, e.g. a
`git worktree add /tmp/nr-old <commit>` built with `setup.py build_ext --inplace`):

    PYTHONPATH=. python benchmarks/loss.py --loss 0,0.01,0.05 --old /tmp/nr-old

Testbed (root): 3 emulated hosts and an aggregator in namespaces, 1 Gbit/s links,
loss by nftables on every namespace's input (UDP only; the control plane's TCP is
spared):

    PYTHONPATH=. python benchmarks/loss.py --testbed --loss 0,0.01,0.05 --old /tmp/nr-old

The ranks are this file run as `worker` (it imports whichever netreduce its
PYTHONPATH names). A warm-up all-reduce lines the ranks up; the figure is the
slowest rank's wall time for the stream.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
OPS = ("sum", "min", "max")


def plan(n: int, seed: int, max_elems: int) -> List[Tuple[int, str, str]]:
    """The stream every rank runs: (elements, dtype, op), sizes log-uniform in
    1..max_elems. Derived from the seed alone, so ranks agree without talking."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(0.0, np.log(max_elems + 1), n)).astype(np.int64)
    return [(max(1, int(s)), DTYPES[int(d)], OPS[int(o)])
            for s, d, o in zip(sizes, rng.integers(0, len(DTYPES), n), rng.integers(0, len(OPS), n))]


def contribution(seed: int, i: int, rank: int, count: int, dtype: str) -> np.ndarray:
    """Rank `rank`'s input to all-reduce i: small integers (-8..8), so that every
    dtype holds every sum exactly and the result is the same in any order of
    addition. bfloat16 travels as uint16 bit patterns (float32's top half)."""
    vals = np.random.default_rng([seed, i, rank]).integers(-8, 9, count)
    if dtype == "bfloat16":
        return (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return vals.astype(dtype)


def reference(seed: int, i: int, size: int, count: int, dtype: str, op: str) -> np.ndarray:
    parts = [contribution(seed, i, r, count, "float32" if dtype == "bfloat16" else dtype)
             for r in range(size)]
    out = {"sum": np.sum, "min": np.min, "max": np.max}[op](np.stack(parts), axis=0)
    if dtype == "bfloat16":
        return (out.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return out.astype(dtype)


def worker(rank: int, size: int, address: Tuple[str, int], job: str, n: int, seed: int,
           max_elems: int, drop_rate: float, timeout: float, check: bool = True,
           **engine_kw) -> Dict:
    """One rank: the whole stream, timed; every result against the reference."""
    from netreduce.worker import dataplane

    ops = plan(n, seed, max_elems)
    inputs = [contribution(seed, i, rank, c, d) for i, (c, d, _) in enumerate(ops)]
    digest = hashlib.sha256()
    wrong: List[str] = []
    with dataplane.connect(address, job, rank, size, timeout=timeout, drop_rate=drop_rate,
                           seed=seed * 1000 + rank + 1, **engine_kw) as conn:
        conn.allreduce(np.zeros(1, np.float32))  # everyone registered and in step
        outs = []
        times = np.empty(len(ops))
        t0 = time.perf_counter()
        for i, ((count, dtype, op), a) in enumerate(zip(ops, inputs)):
            outs.append(conn.allreduce(a, np.empty_like(a), op=op,
                                       dtype="bfloat16" if dtype == "bfloat16" else None))
            times[i] = time.perf_counter()
        elapsed = time.perf_counter() - t0
        times = np.diff(np.concatenate([[t0], times]))
        stats = conn.stats()
        # Which way packets were lost, as the aggregator saw it: a resend for a slot
        # still waiting (a contribution missing) or for a completed one (its result
        # lost, or the resend needless). Read by rank 0 when its stream is done.
        agg = conn.counters()["jobs"].get(job, {}) if rank == 0 else {}
    for i, ((count, dtype, op), out) in enumerate(zip(ops, outs)):
        digest.update(out.tobytes())
        if check:
            ref = reference(seed, i, size, count, dtype, op)
            if out.tobytes() != ref.tobytes():
                bad = int(np.flatnonzero(out != ref)[0]) if out.shape == ref.shape else -1
                wrong.append(f"all-reduce {i} ({count} x {dtype} {op}): first wrong element {bad}")
    keys = ("retransmits", "fast_retransmits", "spurious_retransmits", "dropped_by_knob",
            "packets_sent", "ignored_results", "timeout_probes", "srtt_us", "rto_us",
            "tail_probes", "tail_copies", "repaired_chunks", "repair_wait_us", "needless_by_repeat",
            "overtaken_resends", "gap_resends")
    slow = np.argsort(times)[-3:][::-1]
    return {"rank": rank, "seconds": elapsed,
            "slowest_ms": [[int(i), round(float(times[i]) * 1e3, 1)] for i in slow], "digest": digest.hexdigest(), "wrong": wrong[:10],
            "n_wrong": len(wrong), "stats": {k: int(stats.get(k, 0)) for k in keys},
            "aggregator": {k: int(agg.get(k, 0)) for k in ("duplicates", "retransmitted_results")}}


def _worker_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="loss.py worker")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("job")
    p.add_argument("rank", type=int)
    p.add_argument("size", type=int)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-elems", type=int, default=65536)
    p.add_argument("--drop-rate", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--no-check", action="store_true")
    a = p.parse_args(argv)
    out = worker(a.rank, a.size, (a.host, a.port), a.job, a.n, a.seed, a.max_elems,
                 a.drop_rate, a.timeout, check=not a.no_check)
    print(json.dumps(out), flush=True)
    return 0


def _env(tree: Optional[str]) -> Dict[str, str]:
    path = tree or REPO
    return dict(os.environ, PYTHONPATH=os.pathsep.join([path, REPO + "/benchmarks"]))


def _collect(procs, timeout: float) -> List[Dict]:
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"rank exited {p.returncode}: {err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _summary(results: List[Dict]) -> Dict:
    digests = {r["digest"] for r in results}
    total = {k: sum(r["stats"][k] for r in results) // (len(results) if k.endswith("_us") else 1)
             for k in results[0]["stats"]}  # summed over ranks; the estimates averaged
    return {"seconds": max(r["seconds"] for r in results), "exact": len(digests) == 1 and
            all(r["n_wrong"] == 0 for r in results), "wrong": [w for r in results for w in r["wrong"]],
            "stats": total, "aggregator": next((r["aggregator"] for r in results if r["rank"] == 0), {}),
            "slowest_ms": max((r["slowest_ms"] for r in results), key=lambda x: x[0][1])}


def run_loopback(tree: Optional[str], size: int, loss: float, args) -> Dict:
    env = _env(tree)
    # `python -m` puts the working directory first on sys.path: run the aggregator from
    # the tree under test, or it would be this checkout's whatever PYTHONPATH says.
    sw = subprocess.Popen([sys.executable, "-m", "netreduce.switch", "--host", "127.0.0.1",
                           "--port", "0"], stdout=subprocess.PIPE, text=True, env=env,
                          cwd=tree or REPO)
    try:
        line = ""
        while not line.startswith("netreduce-switch listening"):
            line = sw.stdout.readline()
            if not line:
                raise RuntimeError("netreduce-switch did not start")
        port = int(line[len("netreduce-switch listening on "):].split()[0].rsplit(":", 1)[1])
        job = "loss-" + uuid.uuid4().hex[:6]
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", "127.0.0.1",
                                   str(port), job, str(r), str(size), "--n", str(args.n),
                                   "--seed", str(args.seed), "--max-elems", str(args.max_elems),
                                   "--drop-rate", str(loss)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for r in range(size)]
        return _summary(_collect(procs, 600))
    finally:
        sw.terminate()
        sw.wait(10)


def run_testbed(tb, tree: Optional[str], size: int, loss: float, args) -> Dict:
    env = _env(tree)
    tb.set_loss(loss, "udp")
    with contextlib.chdir(tree or REPO):  # the tree's aggregator (see run_loopback)
        switch = tb.spawn_switch(env=env)
    try:
        host, port = switch.address
        job = "loss-" + uuid.uuid4().hex[:6]
        procs = [tb.popen(r, [sys.executable, os.path.abspath(__file__), "worker", host, str(port),
                              job, str(r), str(size), "--n", str(args.n), "--seed", str(args.seed),
                              "--max-elems", str(args.max_elems)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for r in range(size)]
        return _summary(_collect(procs, 600))
    finally:
        switch.stop()


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        return _worker_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loss", default="0,0.01,0.05", help="loss rates, comma-separated")
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--n", type=int, default=1000, help="all-reduces per run")
    p.add_argument("--max-elems", type=int, default=65536)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeat", type=int, default=1, help="runs per cell (the median is kept)")
    p.add_argument("--old", default=None, help="tree of an older build to run side by side")
    p.add_argument("--new", default=None, help="tree of the build under test (default: this checkout)")
    p.add_argument("--testbed", action="store_true", help="namespaces + nftables loss (root)")
    p.add_argument("--json", default=None)
    p.add_argument("--pool", default=None, metavar="A.json,B.json",
                   help="run nothing: pool the runs of earlier --json records (same builds, "
                        "losses and repeats each) into one table")
    args = p.parse_args(argv)
    if args.pool:
        return _pool(args.pool.split(","))
    losses = [float(x) for x in args.loss.split(",")]
    trees = [("new", args.new)] + ([("old", args.old)] if args.old else [])
    cells: Dict[str, Dict[float, List[Dict]]] = {name: {x: [] for x in losses} for name, _ in trees}
    tb = None
    if args.testbed:
        from netreduce.testbed import Testbed
        tb = Testbed(hosts=args.ranks, rate="1gbit", name=f"nl{os.getpid() & 0xFFFF:04x}",
                     subnet="10.78.247.0/24", replace=True)
        tb.up()
    try:
        for _ in range(args.repeat):  # interleaved: load drifts hit every cell alike
            for x in losses:
                for name, tree in trees:
                    r = (run_testbed(tb, tree, args.ranks, x, args) if tb else
                         run_loopback(tree, args.ranks, x, args))
                    cells[name][x].append(r)
                    print(f"{name} loss {x:g}: {r['seconds']:.3f} s exact={r['exact']} "
                          f"{r['stats']} slowest {r['slowest_ms']}", file=sys.stderr, flush=True)
    finally:
        if tb is not None:
            tb.down()
    where = "testbed (nftables, UDP, every namespace's input)" if tb else "loopback (engine drop knob)"
    print(f"\n{args.ranks} ranks, {args.n} all-reduces (1..{args.max_elems} elements, every dtype "
          f"and op), {where}; load: {os.getloadavg()[0]:.1f}\n")
    _table(cells, losses, args.ranks)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "cells": {n: {str(x): rs for x, rs in c.items()}
                                                     for n, c in cells.items()}}, f, indent=1)
    bad = [r for c in cells.values() for rs in c.values() for r in rs if not r["exact"]]
    return 1 if bad else 0


def _pool(paths: List[str]) -> int:
    """One table over the runs of several records; pairs stay within their record."""
    cells: Dict[str, Dict[float, List[Dict]]] = {}
    ranks = 3
    for path in paths:
        with open(path) as f:
            rec = json.load(f)
        ranks = rec["args"]["ranks"]
        for name, c in rec["cells"].items():
            for x, rs in c.items():
                cells.setdefault(name, {}).setdefault(float(x), []).extend(rs)
    losses = sorted(next(iter(cells.values())))
    print(f"\npooled: {', '.join(paths)}\n")
    _table(cells, losses, ranks)
    return 0


def _table(cells: Dict[str, Dict[float, List[Dict]]], losses: List[float], ranks: int) -> None:
    med = {name: {x: sorted(rs, key=lambda r: r["seconds"])[len(rs) // 2] for x, rs in c.items()}
           for name, c in cells.items()}
    print("| build | loss | runs | seconds (min-max) | x lossless (ratio of medians) | paired | exact | "
          "retransmits | fast | tail probes | timeout probes | spurious | repeat seen | tail copies | "
          "repaired | ms per repair | repair wait per rank / lossless | dup waiting | dup done |")
    print("|---|---:|---:|---:|---:|---:|:---:|" + "---:|" * 12)
    for name in cells:
        base = med[name][losses[0]]["seconds"]
        for x in losses:
            r = med[name][x]
            s = r["stats"]
            a = r.get("aggregator", {})
            runs = [q["seconds"] for q in cells[name][x]]
            # Paired: each repeat's run against the same build's lossless run of that
            # repeat (run next to it), then the median of those ratios.
            paired = float(np.median([q / b["seconds"] for q, b in zip(runs, cells[name][losses[0]])]))
            # What the repairs cost, free of the runs' noise: one rank's share of the
            # summed first-send-to-result waits of repaired chunks, over lossless time
            # (an upper bound: waits of the ranks overlap, and some overlap other work).
            share = s["repair_wait_us"] / 1e6 / ranks / base
            print(f"| {name} | {x:.0%} | {len(runs)} | {r['seconds']:.3f} ({min(runs):.2f}-{max(runs):.2f}) | "
                  f"{r['seconds'] / base:.2f} | {paired:.2f} | "
                  f"{'yes' if all(q['exact'] for q in cells[name][x]) else 'NO'} | "
                  f"{s['retransmits']} | {s['fast_retransmits']} | "
                  f"{s['tail_probes']} | {s['timeout_probes']} | {s['spurious_retransmits']} | "
                  f"{s.get('needless_by_repeat', 0)} | {s['tail_copies']} | {s['repaired_chunks']} | "
                  f"{s['repair_wait_us'] / max(1, s['repaired_chunks']) / 1e3:.2f} | {share:.1%} | "
                  f"{a.get('duplicates', 0) - a.get('retransmitted_results', 0)} | "
                  f"{a.get('retransmitted_results', 0)} |")


if __name__ == "__main__":
    sys.exit(main())
