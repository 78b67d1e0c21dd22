#!/usr/bin/env python3
"""All-reduce benchmark: netreduce's data plane side by side with the all-reduces
people use today, measured in the same run, printed like nccl-tests.

Loopback (issue 2): all processes on this machine, no emulated network.

    PYTHONPATH=. python benchmarks/allreduce.py                      # 4 KiB..256 MiB, N=2,4
    PYTHONPATH=. python benchmarks/allreduce.py --quick --json /tmp/a.json

Testbed (issue 5, root): one network namespace per rank, links shaped to --rate,
the aggregator's link N x rate (see docs/testbed.md). Adds Open MPI and Horovod.

    PYTHONPATH=. python benchmarks/allreduce.py --testbed --rate 1gbit --np 4,8 \\
        --json benchmarks/results/testbed.json --plot benchmarks/results/testbed.png

Implementations (--impls): netreduce (the raw data plane: netreduce.worker.dataplane
over a netreduce-switch), gloo (torch.distributed, gloo backend, ring all-reduce), mpi
(mpi4py MPI_Allreduce, Open MPI forced onto TCP over the emulated links), horovod
(Horovod 0.28.1 with Gloo; benchmarks/setup_peers.sh installs it).

Every rank times the same iterations after one verified warm-up; time is the
slowest rank's mean per iteration. Columns follow nccl-tests: algbw = S/t,
busbw = algbw x 2(N-1)/N (GB/s = 10^9 B/s). In testbed mode each rank also reads
its own link's byte counters (wire bytes per host each way) and its CPU time; rank 0
records the aggregator's CPU and the whole machine's busy fraction.

This file is the command line and the tables; one rank's side (the implementations
and the timed sweep) is benchmarks/allreduce_rank.py, where ranks run and how their
records merge is benchmarks/allreduce_launch.py."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if REPO not in sys.path:
    sys.path.insert(1, REPO)

import allreduce_launch as launch  # noqa: E402
import common  # noqa: E402

IMPLS = ("netreduce", "gloo", "mpi", "horovod")
LOOPBACK_IMPLS = ("netreduce", "gloo")
TESTBED_IMPLS = IMPLS


def add_ratios(records: List[dict]) -> None:
    """time(netreduce) / time(other) for every other impl at the same N and size."""
    index = {(r["impl"], r["np"], r["size"]): r for r in records}
    for r in records:
        if r["impl"] != "netreduce":
            continue
        for other in IMPLS[1:]:
            o = index.get((other, r["np"], r["size"]))
            if o and o["time_s"] > 0:
                r[f"ratio_vs_{other}"] = r["time_s"] / o["time_s"]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", default=None, help="world sizes, comma-separated (default 2,4; testbed 4,8)")
    ap.add_argument("--impls", default=None,
                    help=f"comma-separated subset of {','.join(IMPLS)} "
                         f"(default loopback: {','.join(LOOPBACK_IMPLS)}; testbed: all)")
    ap.add_argument("--min-size", default=None, help="smallest message (default 4K; testbed 256K)")
    ap.add_argument("--max-size", default="256M", help="largest message (default 256M)")
    ap.add_argument("--factor", type=int, default=4, help="size step factor (default 4)")
    ap.add_argument("--target-bytes", default=None,
                    help="bytes to move per size, setting the iteration count (default 512M; testbed 64M)")
    ap.add_argument("--min-iters", type=int, default=None, help="timed iterations at least (default 3; testbed 2)")
    ap.add_argument("--max-iters", type=int, default=200, help="timed iterations at most (default 200)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: sizes up to 4M (testbed 16M), few iterations, N=2 (testbed 4)")
    ap.add_argument("--testbed", action="store_true", help="run each rank in its own emulated host (root)")
    ap.add_argument("--rate", default="1gbit", help="testbed: per-host link rate (default 1gbit)")
    ap.add_argument("--loss", type=float, default=0.0, help="testbed: random loss fraction (default 0)")
    ap.add_argument("--testbed-name", default="nrtbb", help="testbed name prefix (default nrtbb)")
    ap.add_argument("--mtu", type=int, default=9000, help="testbed: link MTU (default 9000)")
    ap.add_argument("--subnet", default="10.79.0.0/24", help="testbed: subnet (default 10.79.0.0/24)")
    ap.add_argument("--switch-args", default="",
                    help="extra netreduce-switch options, e.g. '--slots 64 --payload-bytes 61440'")
    ap.add_argument("--mpi-args", default="",
                    help="extra mpirun options, e.g. '--mca coll_tuned_use_dynamic_rules 1 "
                         "--mca coll_tuned_allreduce_algorithm 4' (ring)")
    ap.add_argument("--nr-window", type=int, default=None,
                    help="netreduce: slots each worker keeps in flight (default: the engine's)")
    ap.add_argument("--nr-retransmit-ms", type=float, default=None,
                    help="netreduce: first retransmission timeout, ms (default: the engine's)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per (impl, N) sweep")
    ap.add_argument("--json", default=None, help="write all records (and run metadata) here")
    ap.add_argument("--md", default=None, help="write the tables as a Markdown section here")
    ap.add_argument("--plot", default=None, help="write a PNG (busbw vs size, speed-up) here")
    ap.add_argument("--from-json", default=None,
                    help="only render FILE (from --json) as Markdown (to --md, else stdout)")
    args = ap.parse_args(argv)

    if args.from_json:
        with open(args.from_json) as f:
            data = json.load(f)
        text = common.markdown(data["meta"], data["records"], data["meta"]["impls"])
        if args.md:
            with open(args.md, "w") as f:
                f.write(text)
        else:
            print(text)
        return 0
    nps = [int(x) for x in (args.np or ("4,8" if args.testbed else "2,4")).split(",")]
    impls = (args.impls or ",".join(TESTBED_IMPLS if args.testbed else LOOPBACK_IMPLS)).split(",")
    for i in impls:
        if i not in IMPLS:
            ap.error(f"unknown impl {i!r}; choose from {', '.join(IMPLS)}")
    lo = common.parse_size(args.min_size or ("256K" if args.testbed else "4K"))
    hi = common.parse_size(args.max_size)
    target = common.parse_size(args.target_bytes or ("64M" if args.testbed else "512M"))
    min_iters = args.min_iters if args.min_iters is not None else (2 if args.testbed else 3)
    max_iters = args.max_iters
    if args.quick:
        hi = min(hi, common.parse_size("16M" if args.testbed else "4M"))
        target, min_iters, max_iters = min(target, 32 << 20), 2, 20
        if args.np is None:
            nps = [4] if args.testbed else [2]
    sizes = common.size_range(lo, hi, args.factor)
    base_cfg = {"sizes": sizes, "target_bytes": target, "min_iters": min_iters, "max_iters": max_iters,
                "timeout": 120.0,
                "netreduce_connect": {"window": args.nr_window, "retransmit_ms": args.nr_retransmit_ms}}

    meta = {"date": common.utc_now(), "command": common.command_line(),
            "machine": common.machine_description(),
            "mode": "testbed" if args.testbed else "loopback", "np": nps, "impls": impls,
            "sizes": sizes, "dtype": "float32", "target_bytes": target,
            "switch_args": args.switch_args, "mpi_args": args.mpi_args,
            "netreduce_connect": base_cfg["netreduce_connect"]}
    meta["loadavg_at_start"] = os.getloadavg()
    if args.testbed:
        meta.update(rate=args.rate, loss=args.loss, mtu=args.mtu)
    print(f"# allreduce benchmark, {meta['mode']}, {meta['date']}", file=sys.stderr)
    print(f"# {meta['machine']['cpu']} x{meta['machine']['cores']}, kernel {meta['machine']['kernel']}, "
          f"torch {meta['machine']['torch']}, horovod {meta['machine']['horovod']}, {meta['machine']['mpi']}",
          file=sys.stderr)
    print(f"# N={nps}  impls={impls}  sizes {common.fmt_size(sizes[0])}..{common.fmt_size(sizes[-1])}",
          file=sys.stderr)

    records: List[dict] = []
    errors: List[str] = []

    def sweep(runner: launch.Runner, n: int) -> None:
        for impl in impls:
            print(f"# running {impl} N={n} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            try:
                per_rank = launch.run_impl(impl, n, runner, base_cfg, args)
                records.extend(launch.merge(impl, n, per_rank))
            except Exception as exc:  # keep going: one missing peer must not void the run
                msg = f"{impl} N={n}: {exc}"
                errors.append(msg)
                print(f"# FAILED {msg}", file=sys.stderr, flush=True)
            print(f"# {impl} N={n} took {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)

    if args.testbed:
        from netreduce.testbed import Testbed
        for n in nps:
            with Testbed(hosts=n, rate=args.rate, loss=args.loss, name=args.testbed_name,
                         subnet=args.subnet, mtu=args.mtu, replace=True) as tb:
                print("# " + tb.describe().replace("\n", "\n# "), file=sys.stderr)
                sweep(launch.Runner(tb), n)
    else:
        for n in nps:
            sweep(launch.Runner(None), n)

    add_ratios(records)
    meta["errors"] = errors
    if args.testbed:
        meta["queue_drops"] = launch.QUEUE_DROPS
        print(f"# packets dropped by the shapers' queues per sweep: {launch.QUEUE_DROPS}",
              file=sys.stderr)
    meta["loadavg_at_end"] = os.getloadavg()
    common.print_tables(records, impls)
    if errors:
        print("\n# errors:\n# " + "\n# ".join(errors))
    if args.json:
        common.write_json(args.json, meta, records)
        print(f"# wrote {args.json}", file=sys.stderr)
    if args.md:
        with open(args.md, "w") as f:
            f.write(common.markdown(meta, records, impls))
        print(f"# wrote {args.md}", file=sys.stderr)
    if args.plot:
        import plot
        plot.plot(meta, records, args.plot)
        print(f"# wrote {args.plot}", file=sys.stderr)
    return 1 if errors or not all(r["correct"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
