"""Large-scale all-reduce simulation on SimGrid's flow-level model (docs/simulation.md).

    python3 benchmarks/simulate.py --out benchmarks/results/simulation.json \
        --md benchmarks/results/simulation.md --plot benchmarks/results/simulation.png

Calibrates against the emulated testbed (benchmarks/results/testbed.json, with the
host software term of benchmarks/sim/software.py; --calibration-only stops there), then
simulates 1,024 workers on a spine-leaf fabric — ring, single-aggregator INA, rack +
spine INA with fixed, hashed and planned (GRID LP + randomized rounding) routes —
for AlexNet, ResNet-50 and BERT-base gradients, alone and with several jobs sharing
the fabric. Needs SimGrid (scripts/env_simgrid.sh) and scipy (the planner)."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim import experiments as ex  # noqa: E402
from benchmarks.sim import calibrate, report  # noqa: E402
from benchmarks.sim.software import NONE  # noqa: E402
from benchmarks.common import parse_size  # noqa: E402

MODELS = ["alexnet", "resnet50", "bert-base"]
CALIBRATION_SIZES = [256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="default benchmarks/results/simulation.json "
                   "(--calibration-only: simulation_calibration.json)")
    p.add_argument("--md", help="default benchmarks/results/simulation.md "
                   "(--calibration-only: simulation_calibration.md)")
    p.add_argument("--plot", help="default benchmarks/results/simulation.png (none with "
                   "--calibration-only)")
    p.add_argument("--calibration-only", action="store_true",
                   help="only the calibration against the testbed, not the 1,024-worker fabric")
    p.add_argument("--testbed", default="benchmarks/results/testbed.json,"
                   "benchmarks/results/simulation_calib_testbed.json,"
                   "benchmarks/results/simulation_calib_testbed_n8.json",
                   help="measured testbed all-reduce records to calibrate against "
                        "(comma-separated: several runs, each its own table)")
    p.add_argument("--loopback", default="benchmarks/results/allreduce.json,"
                   "benchmarks/results/simulation_calib_loopback.json,-",
                   help="loopback runs giving the software term's parameters, one per "
                        "--testbed file ('-': none)")
    p.add_argument("--multi-testbed", default="benchmarks/results/multi_aggregator_testbed.json",
                   help="measured several-aggregator testbed run to calibrate against too")
    p.add_argument("--two-level", default="benchmarks/results/two_level_testbed.json",
                   help="measured rack + spine testbed runs (benchmarks/two_level.py)")
    p.add_argument("--two-level-rate", default="200mbit")
    p.add_argument("--two-level-size", default="4M", help="the --size of that run")
    p.add_argument("--testbed-latency-us", type=float, default=20.0,
                   help="one-way latency per veth+bridge link of the emulated testbed")
    p.add_argument("--racks", type=int, default=32)
    p.add_argument("--hosts-per-rack", type=int, default=32)
    p.add_argument("--spines", type=int, default=8)
    p.add_argument("--host-gbps", type=float, default=100.0)
    p.add_argument("--uplink-gbps", default="25,100,400",
                   help="leaf-spine link rates to sweep (with 32 x 100G hosts and 8 "
                        "spines: 25 is 16:1 oversubscription, 100 is 4:1, 400 is 1:1)")
    p.add_argument("--latency-us", type=float, default=1.0, help="per link, one way")
    p.add_argument("--jobs", type=int, default=8, help="jobs sharing the fabric")
    p.add_argument("--chunk-mib", type=float, default=8.0,
                   help="tensors larger than this are cut into chunks the planner places")
    p.add_argument("--trials", type=int, default=32, help="randomized roundings kept best of")
    p.add_argument("--models", default=",".join(MODELS))
    return p.parse_args()


def calibration(args: argparse.Namespace) -> Dict[str, Any]:
    """Star runs (N=4, 8), then the several-aggregator and rack + spine runs with
    the netreduce N=4 software term fitted on the first testbed file."""
    lat = args.testbed_latency_us
    testbeds = [t for t in (args.testbed or "").split(",") if t]
    loops = (args.loopback or "").split(",")
    out: Dict[str, Any] = {"star": [], "multi": [], "two_level": []}
    sw = None
    for i, tb in enumerate(testbeds):
        loop = loops[i] if i < len(loops) and loops[i] not in ("", "-") else None
        table, methods = calibrate.star_table(tb, lat, loop, sizes=CALIBRATION_SIZES)
        out["star"].append(table)
        if sw is None:
            sw = methods["testbed-fit"].get(("netreduce", 4))
    sw = sw or NONE
    if args.multi_testbed and os.path.exists(args.multi_testbed):
        out["multi"] = calibrate.multi_table(args.multi_testbed, lat, sw)
    if args.two_level and os.path.exists(args.two_level):
        out["two_level"] = calibrate.two_level_table(
            args.two_level, args.two_level_rate, parse_size(args.two_level_size), lat, sw)
    return out


def main() -> int:
    args = parse()
    stem = "benchmarks/results/simulation" + ("_calibration" if args.calibration_only else "")
    args.out = args.out or stem + ".json"
    args.md = args.md or stem + ".md"
    if args.plot is None and not args.calibration_only:
        args.plot = stem + ".png"
    started = time.time()
    load_start = os.getloadavg()
    chunk = int(args.chunk_mib * (1 << 20))
    models = args.models.split(",")
    rows: List[Dict[str, Any]] = []
    calib = calibration(args)
    print(f"simulate: calibration done ({time.time() - started:.0f} s)", file=sys.stderr)
    for up in ([] if args.calibration_only else [float(u) for u in args.uplink_gbps.split(",")]):
        topo_args = dict(racks=args.racks, hosts_per_rack=args.hosts_per_rack,
                         spines=args.spines, host_gbps=args.host_gbps, uplink_gbps=up,
                         latency_us=args.latency_us)
        for m in models:
            rows += ex.single_job(topo_args, m, chunk, args.trials)
            print(f"simulate: single job, {m}, uplinks {up:g} Gbit/s done "
                  f"({time.time() - started:.0f} s)", file=sys.stderr)
        mixes = [[m] * args.jobs for m in models]
        if len(models) > 1:
            mixes.append([models[j % len(models)] for j in range(args.jobs)])
        for mix in mixes:
            rows += ex.shared(topo_args, mix, chunk, args.trials)
            print(f"simulate: {args.jobs} jobs, {mix[0] if len(set(mix)) == 1 else 'mixed'}, "
                  f"uplinks {up:g} Gbit/s done ({time.time() - started:.0f} s)", file=sys.stderr)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python3 " + " ".join(sys.argv),
            "python": platform.python_version(), "simgrid_model": "CM02 (flow-level, max-min)",
            "seconds": round(time.time() - started, 1),
            "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg(),
            "args": vars(args)}
    result = {"meta": meta, "calibration": calib, "rows": rows}
    for path in (args.out, args.md, args.plot):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    text = report.markdown(result)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(text)
    if args.plot and rows:
        report.plot(result, args.plot)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
