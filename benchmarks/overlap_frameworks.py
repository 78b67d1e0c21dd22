#!/usr/bin/env python3
"""Issue 33's first target for Keras and MXNet: each netreduce path's training step
against its overlap bound, beside the framework's own strategy, in one run.

    # as root (the testbed): N=4 ranks one per host at 1 Gbit/s, MTU 9000
    python3 benchmarks/overlap_frameworks.py keras --runs 5   # nr-hvd, tf-mwms, compute
    python3 benchmarks/overlap_frameworks.py mxnet --runs 5   # nr-kv, dist_sync, compute

The model is the one benchmarks/train_tensorflow.py and train_mxnet.py train (their
``build_alexnet``: torchvision's AlexNet layout, 61.1 M parameters, S = 244.4 MB of
float32 gradients, 95 % of it in the dense layers that backward reaches first),
64x64 synthetic images, per-rank batch 8, SGD with momentum. Modes, each run all of
them in an order rotated from run to run (paired alternation):

    keras  nr-hvd     netreduce.tensorflow.keras.DistributedOptimizer, tf.function step
           nr-strategy  netreduce.tensorflow.Strategy() (optional)
           tf-mwms    MultiWorkerMirroredStrategy, CommunicationImplementation.RING
    mxnet  nr-kv      gluon.Trainer(kvstore="netreduce")
           nr-hvd     netreduce.mxnet.DistributedTrainer (optional)
           dist_sync  gluon.Trainer(kvstore="dist_sync"), a ps-lite server per host
    both   compute    the same 4 processes at once, no communication: forward F,
                      backward B and update U, each timed on its own (synchronised)

The bound of a step: F + max(B, S/R) + U (R the link rate), F/B/U from the compute
mode of the same run; a path meets issue 33's target when its step <= 1.1 x bound.
The step is the median of the timed steps' wall time on rank 0 (each step ends when
its update has run: a tf.function call returns, MXNet's waitall). The netreduce modes
write rank 0's NETREDUCE_TIMELINE; per step it gives when the gradients reached the
core (first and last ``ready``), each fusion message's start and end, the link's idle
time between messages, and the wait from the last message's end to the step's end.
The record (benchmarks/results/issue33/overlap_{keras,mxnet}_UTC.json) keeps every
run with its load average; the summary is medians with (min, max).

Each mode also records the whole machine's CPU over rank 0's timed steps (``machine_cpu``,
overlap_step.py's: busy fraction, every rank process's and the aggregator's CPU-seconds
per step; the compute mode's over whole steps run back to back after its F/B/U
timings). ``--floor`` adds a part to each run's rotation, the paced do-nothing floor
of benchmarks/cpu_bounds.py on the same testbed (rounds of ``--floor-bytes``), and
reads every step against the run's CPU floor, step_floor.py's (d): (the compute mode's
ranks' CPU per step + the floor's CPU for the step's S bytes, 4 ranks and the
reflector) / the cores (``cpu_floor_of``; the summary's ``cpu_floor``):

    python3 benchmarks/overlap_frameworks.py keras --runs 5 --steps 3 --warmup 1 \
        --modes nr-hvd,compute,tf-mwms --floor

Paired A/B of two versions of the adapter: ``--code base=DIR`` and a mode ``MODE@base``
run MODE with netreduce (and netreduce.mxnet) from checkout DIR, built in place, in
the same rotation as the others (mxnet; the workers import the adapter from the
checkout they are given, the one this script is in by default):

    python3 benchmarks/overlap_frameworks.py mxnet --runs 5 --code base=/tmp/base \
        --modes nr-kv,nr-kv@base,compute

A mode written MODE%VARIANT (after an @CODE too) runs with the environment
``--env-variant VARIANT:K=V[,K=V]`` gives in every rank's process (overlap_step.py's
notation), in the same rotation: a paired A/B of a setting; each run records its step
over MODE's (``MODE%VARIANT_step_vs_MODE``) and its ranks' CPU over MODE's:

    python3 benchmarks/overlap_frameworks.py keras --runs 5 --modes nr-hvd,nr-hvd%one,compute \
        --env-variant one:NRBENCH_TF_INTER_OP=1
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
MODES = {"keras": ("nr-hvd", "tf-mwms", "compute"), "mxnet": ("nr-kv", "dist_sync", "compute")}
OPTIONAL = {"keras": ("nr-strategy",), "mxnet": ("nr-hvd",)}

from overlap_fw_modes import describe, run_mode  # noqa: E402
from overlap_fw_ranks import worker  # noqa: E402
from overlap_fw_record import ab_ratios, bound_of, cpu_floor_of, mode_line, refloor, write  # noqa: E402


def driver(args: argparse.Namespace) -> str:
    import common
    from netreduce.testbed import Testbed, why_unusable
    from netreduce.testbed.plan import parse_rate

    reason = why_unusable()
    if reason:
        raise SystemExit(f"overlap_frameworks.py: {reason}")
    modes = args.modes.split(",") if args.modes else list(MODES[args.target])
    parts = modes + (["floor"] if args.floor else [])
    rate = parse_rate(args.rate)
    runs: List[Dict[str, Any]] = []
    path = ""
    args.commit = common.commit_of(ROOT)  # at the start
    with Testbed(hosts=args.np, rate=args.rate, mtu=args.mtu, name=args.testbed_name,
                 subnet=args.subnet, replace=True) as tb:
        for i in range(args.runs):
            order = parts[i % len(parts):] + parts[:i % len(parts)]
            res: Dict[str, Any] = {}
            floor_rec: Dict[str, Any] = {}
            for mode in order:
                if mode == "floor":  # step_floor's (d): the paced floor, this testbed
                    import step_floor
                    load = os.getloadavg()[0]
                    try:
                        floor_rec = step_floor.comm_cpu(tb, args, common.parse_size(args.floor_bytes))
                    except Exception as exc:  # keep the run's modes
                        floor_rec = {"error": repr(exc)}
                    floor_rec["load"] = [load, os.getloadavg()[0]]
                    print(f"  run {i} floor: {json.dumps(floor_rec)}", flush=True)
                    continue
                with tempfile.TemporaryDirectory(prefix=f"nrovfw-{mode}-") as tmp:
                    res[mode] = r = run_mode(tb, mode, args, tmp)
                print(f"  run {i} {mode}: {mode_line(mode, r)}; load {r['load'][0]:.1f}", flush=True)
                if "timeline" in r:
                    print(describe(r["timeline"]), flush=True)
            run: Dict[str, Any] = {"run": i, "order": order, "modes": res}
            if floor_rec:
                run["floor"] = floor_rec
            bound_of(run, res, modes, rate)
            if args.floor:
                run["cpu_floor"] = cpu_floor_of(run, args.np, os.cpu_count() or 1)
            ab_ratios(run, res, modes)
            runs.append(run)
            print("  " + json.dumps({k: v for k, v in run.items() if k not in ("modes", "order", "floor")}),
                  flush=True)
            path = write(args, modes, runs, path)  # after every run: a cut-short run keeps its runs
    print(json.dumps(json.load(open(path))["summary"], indent=1))
    print(f"# wrote {path}")
    return path


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", choices=sorted(MODES))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--modes", default="", help="default: the target's netreduce path, its "
                    "peer and compute; also nr-strategy (keras), nr-hvd (mxnet)")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--batch-size", type=int, default=8, help="per rank")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per mode and run")
    ap.add_argument("--no-timeline", dest="timeline", action="store_false",
                    help="no NETREDUCE_TIMELINE on rank 0 of the netreduce modes")
    ap.add_argument("--keep", default="", help="folder to keep the timelines in")
    ap.add_argument("--switch-args", default="")
    ap.add_argument("--nr-env", action="append", default=[], help="KEY=VALUE, netreduce modes")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mode")
    ap.add_argument("--testbed-name", default="nrovfw")
    ap.add_argument("--subnet", default="10.77.34.0/24")
    ap.add_argument("--out", default="")
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                    help="a checkout (built in place) that modes MODE@NAME take the adapter "
                    "from (mxnet)")
    ap.add_argument("--floor", action="store_true",
                    help="each run also measures the paced floor (benchmarks/step_floor.py's (d)) "
                    "and reads every step against the CPU floor; needs the compute mode")
    ap.add_argument("--floor-bytes", default="64M", help="bytes per floor round (scaled per byte to S)")
    ap.add_argument("--floor-rounds", type=int, default=5)
    ap.add_argument("--env-variant", action="append", default=[], metavar="NAME:K=V[,K=V]",
                    help="the environment of modes MODE%%NAME (every rank's process)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--refloor", default="", metavar="RECORD",
                    help="measure nothing: RECORD's CPU floors and summary again (rewritten in place)")
    args = ap.parse_args(argv)
    if args.refloor:
        refloor(args.refloor)
        return 0
    if args.worker:
        worker(args)
        return 0
    import overlap_step
    codes = dict(c.split("=", 1) for c in args.code)
    args.variants = overlap_step.parse_variants(args.env_variant)
    for label in (args.modes.split(",") if args.modes else []):
        mode, code, variant = overlap_step.parse_label(label)
        if variant and variant not in args.variants:
            ap.error(f"--modes: {label!r} names variant {variant!r} that no --env-variant gives")
        if mode not in MODES[args.target] + OPTIONAL[args.target]:
            ap.error(f"unknown mode {mode!r} for {args.target}")
        if code and (args.target != "mxnet" or code not in codes):
            ap.error(f"{label}: MODE@NAME needs the mxnet target and --code NAME=DIR")
    if args.floor and "compute" not in (args.modes.split(",") if args.modes else MODES[args.target]):
        ap.error("--floor needs the compute mode (the ranks' CPU per step without communication)")
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    driver(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
