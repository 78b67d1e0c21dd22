#!/usr/bin/env python3
"""Hierarchical all-reduce benchmark: several ranks per host, side by side with flat
netreduce, gloo, Open MPI and Horovod in the same run (issue 9).

Testbed (root): H emulated hosts, L ranks in each host's namespace, 1 Gbit/s links.

    PYTHONPATH=. python benchmarks/hierarchical.py --testbed --hosts 2 --per-host 2,4 \\
        --sizes 64M --json /tmp/hier_tb.json

One host (no network): N = L ranks, Open MPI on its shared-memory transport (vader),
and memcpy bandwidth measured in the same run next to the shared-memory stage's.

    PYTHONPATH=. python benchmarks/hierarchical.py --hosts 1 --per-host 4 --sizes 4K,64M \\
        --impls hierarchical,mpi,gloo,horovod

The ranks are those of benchmarks/allreduce.py (benchmarks/allreduce_rank.py: same
verified warm-up, same timing, the slowest rank's mean per iteration), where the
``hierarchical`` implementation (the algorithm layer over a netreduce-switch,
NETREDUCE_ALGORITHM=hierarchical) and ``hierarchical-api`` (through nr.init()) live
too; this file adds the rank -> host placement and the tables.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if REPO not in sys.path:
    sys.path.insert(1, REPO)

import allreduce_launch as launch  # noqa: E402
import common  # noqa: E402

IMPLS = ("hierarchical", "hierarchical-api", "netreduce", "gloo", "mpi", "horovod")


class HostRunner(launch.Runner):
    """Rank r runs on host r // L (its namespace on the testbed)."""

    def __init__(self, testbed, per_host: int, hosts: int) -> None:
        super().__init__(testbed)
        self.per_host = per_host
        name = (lambda h: f"h{h}") if testbed else (lambda h: "localhost")
        self.horovod_hosts = ",".join(f"{name(h)}:{per_host}" for h in range(hosts)) \
            if testbed else f"localhost:{per_host * hosts}"

    switch_nice = 0  # --switch-nice: the aggregator stands in for switch hardware

    def spawn_switch(self, args: List[str]):
        address, pid, stop = super().spawn_switch(args)
        if self.switch_nice:  # nice is per thread on Linux: every thread of the daemon
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.setpriority(os.PRIO_PROCESS, int(tid), self.switch_nice)
        return address, pid, stop

    def host_addr(self, rank: int) -> str:
        return super().host_addr(rank // self.per_host)

    def wrap(self, rank: int, argv: List[str]) -> List[str]:
        return super().wrap(rank // self.per_host, argv)


def memcpy_gbps(nbytes: int) -> float:
    """Single-thread memcpy bandwidth (bytes copied / s, best of 5), this machine, now."""
    import numpy as np
    a = np.ones(nbytes // 4, dtype=np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--testbed", action="store_true", help="one namespace per host (root)")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", default="2", help="ranks per host, comma-separated sweep")
    ap.add_argument("--sizes", default="64M", help="message sizes, comma-separated")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations at the largest size")
    ap.add_argument("--shm-chunk", default="", help="NETREDUCE_SHM_CHUNK for hierarchical")
    ap.add_argument("--shm-depth", type=int, default=0, help="ring depth for hierarchical (default 2)")
    ap.add_argument("--switch-nice", type=int, default=0,
                    help="nice value for the netreduce-switch process, e.g. -5: on a loaded "
                         "2-core machine the aggregator (a switch in reality) otherwise "
                         "competes with every rank for CPU (default 0: no change)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sizes = [common.parse_size(s) for s in args.sizes.split(",")]
    impls = args.impls.split(",")
    # Open MPI's shared-memory transport on one host; TCP over the emulated links on
    # the testbed (vader would bypass them between namespaces).
    args.mpi_btl = "tcp,self" if args.testbed else "self,vader"
    args.mpi_args, args.switch_args = "", ""
    base = {"sizes": sizes, "target_bytes": max(sizes) * args.iters, "min_iters": args.iters,
            "max_iters": 2000, "timeout": 60.0, "netreduce_connect": {},
            "shm_chunk": args.shm_chunk, "shm_depth": args.shm_depth}
    meta = {"date": common.utc_now(), "command": common.command_line(),
            "machine": common.machine_description(), "hosts": args.hosts,
            "testbed": args.testbed, "rate": args.rate if args.testbed else None,
            "loadavg_at_start": os.getloadavg(), "memcpy_GBps": memcpy_gbps(max(sizes))}
    print(f"# memcpy {meta['memcpy_GBps']:.2f} GB/s (one thread, {common.fmt_size(max(sizes))})",
          file=sys.stderr)
    HostRunner.switch_nice = args.switch_nice
    meta["switch_nice"] = args.switch_nice
    records: List[dict] = []
    errors: List[str] = []
    for L in (int(x) for x in args.per_host.split(",")):
        n = L * args.hosts

        def sweep(runner) -> None:
            for impl in impls:
                print(f"# {impl} {args.hosts} hosts x {L} ranks ...", file=sys.stderr, flush=True)
                try:
                    per_rank = launch.run_impl(impl, n, runner, dict(base, per_host=L), args)
                except Exception as exc:  # one missing peer must not void the run
                    errors.append(f"{impl} {args.hosts}x{L}: {exc}")
                    print(f"# FAILED {errors[-1]}", file=sys.stderr, flush=True)
                    continue
                for rec in launch.merge(impl, n, per_rank):
                    rec["per_host"], rec["hosts"] = L, args.hosts
                    mine = [r for r in per_rank if r["size"] == rec["size"]]
                    for k in ("shm_busy_ns", "shm_wait_ns", "shm_net_wait_ns"):
                        if all(k in r for r in mine):
                            rec[k.replace("_ns", "_s")] = max(r[k] for r in mine) / 1e9
                    records.append(rec)
                    print(f"  {impl:13s} {args.hosts}x{L} {common.fmt_size(rec['size']):>6} "
                          f"{rec['time_s'] * 1e3:9.2f} ms  correct={rec['correct']}",
                          file=sys.stderr, flush=True)

        if args.testbed:
            from netreduce.testbed import Testbed
            with Testbed(hosts=args.hosts, rate=args.rate, name="nrhb", subnet="10.79.1.0/24",
                         replace=True) as tb:
                sweep(HostRunner(tb, L, args.hosts))
        else:
            sweep(HostRunner(None, L, args.hosts))
    meta["loadavg_at_end"] = os.getloadavg()
    meta["errors"] = errors
    index = {(r["impl"], r["per_host"], r["size"]): r for r in records}
    print(f"\n| hosts x ranks | size | " + " | ".join(f"{i} ms" for i in impls) +
          " | hier/gloo | hier/mpi | hier/flat |")
    print("|---|---|" + "---|" * (len(impls) + 3))
    for (impl, L, size), r in sorted(index.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if impl != impls[0]:
            continue
        row = [index.get((i, L, size)) for i in impls]
        cells = [f"{x['time_s'] * 1e3:.2f}" if x else "-" for x in row]

        def ratio(other: str) -> str:
            o = index.get((other, L, size))
            return f"{r['time_s'] / o['time_s']:.3f}" if o and impl == "hierarchical" else "-"

        print(f"| {args.hosts} x {L} | {common.fmt_size(size)} | " + " | ".join(cells) +
              f" | {ratio('gloo')} | {ratio('mpi')} | {ratio('netreduce')} |")
        if "shm_busy_s" in r and args.hosts == 1:
            print(f"#   shm stage {size / r['time_s'] / 1e9:.2f} GB/s algbw (memcpy "
                  f"{meta['memcpy_GBps']:.2f} GB/s); busiest rank's copy+reduce time "
                  f"{r['shm_busy_s'] / 1 * 1e3:.1f} ms/iter")
    if args.json:
        common.write_json(args.json, meta, records)
    return 1 if errors or not all(r["correct"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
