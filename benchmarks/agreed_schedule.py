#!/usr/bin/env python3
"""The hvd path's communication schedule without the model's compute (issue 33):
N ranks on the testbed submit resnet18's 62 gradients through netreduce's
allreduce_async in backward order, spaced evenly over --backward-ms (sleeps, so the
figure does not move with the machine's load as the real step does), then wait for
all of them; per step, how long after the first submission the last result landed
(``end_ms``), against S/R at the link rate; ``--busy`` spins instead of sleeping
(4 ranks' "backward" on the machine's cores, as in the step). Paired A/B of two checkouts, order
alternated per run (``--code NAME=DIR``; ``main`` is this tree):

    python3 benchmarks/agreed_schedule.py --runs 5 --code base=DIR_OF_MAIN_BUILT \\
        --testbed-name hh1 --subnet 10.93.1.0/24
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if ROOT not in sys.path:
    sys.path.insert(1, ROOT)

from common import spread, write_record  # noqa: E402

# torchvision resnet18's parameters, in model order (backward runs them in reverse)
RESNET18 = ([9408, 64, 64] + [36864, 64, 64] * 4
            + [73728, 128, 128, 147456, 128, 128, 8192, 128, 128, 147456, 128, 128, 147456, 128, 128]
            + [294912, 256, 256, 589824, 256, 256, 32768, 256, 256, 589824, 256, 256, 589824, 256, 256]
            + [1179648, 512, 512, 2359296, 512, 512, 131072, 512, 512, 2359296, 512, 512, 2359296,
               512, 512] + [512000, 1000])

RANK = r"""
import json, os, sys, time
import numpy as np
import netreduce as nr
nr.init()
sizes, steps, warm, gap, busy = json.loads(os.environ["SCHED"])

def pause(s):
    if not busy:
        time.sleep(s)
        return
    end = time.perf_counter() + s    # compute's stand-in: this thread on a core
    while time.perf_counter() < end:
        pass

grads = [np.ones(n, np.float32) for n in sizes]
out = []
for k in range(warm + steps):
    nr.allreduce(np.ones(1, np.float32), name="sync")         # start the step together
    c0 = time.process_time()
    t0 = time.perf_counter()
    hs = []
    for i in reversed(range(len(sizes))):
        hs.append(nr.allreduce_async(grads[i], name=f"g{i}", op=nr.Average, inplace=True))
        pause(gap)
    t1 = time.perf_counter()
    for h in hs:
        nr.synchronize(h)
    t2 = time.perf_counter()
    if k >= warm:
        out.append([(t1 - t0) * 1e3, (t2 - t0) * 1e3, (time.process_time() - c0) * 1e3])
    for g in grads:
        g.fill(1)
if nr.rank() == 0:
    print("SCHED " + json.dumps(out), flush=True)
nr.shutdown()
"""


def run_arm(tb, tree: str, args, tmp: str) -> dict:
    sw = tb.spawn_switch()
    try:
        env0 = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=tree,
                    NETREDUCE_SWITCH=f"{sw.address[0]}:{sw.address[1]}",
                    NETREDUCE_JOB=f"sched-{uuid.uuid4().hex[:8]}", NETREDUCE_SIZE=str(args.np),
                    NETREDUCE_LOCAL_SIZE="1", NETREDUCE_LOCAL_RANK="0",
                    SCHED=json.dumps([RESNET18, args.steps, args.warmup,
                                      args.backward_ms / 1e3 / len(RESNET18), args.busy]))
        procs = []
        for r in range(args.np):
            log = open(os.path.join(tmp, f"r{r}.log"), "w")
            procs.append(tb.popen(r, [sys.executable, "-c", RANK], env=dict(env0, NETREDUCE_RANK=str(r)),
                                  cwd=tmp, stdout=log, stderr=subprocess.STDOUT))
        for p in procs:
            p.wait(timeout=args.timeout)
        text = open(os.path.join(tmp, "r0.log")).read()
        line = [x for x in text.splitlines() if x.startswith("SCHED ")]
        if not line:
            return {"error": text[-800:]}
        steps = json.loads(line[-1][6:])
        return {"submit_ms": statistics.median(s[0] for s in steps),
                "end_ms": statistics.median(s[1] for s in steps),
                "cpu_ms": statistics.median(s[2] for s in steps), "steps": steps,
                "load": os.getloadavg()[0]}
    finally:
        sw.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--backward-ms", type=float, default=255.0, help="submissions spread over this")
    ap.add_argument("--busy", action="store_true",
                    help="spin between submissions instead of sleeping: the ranks' backward "
                    "holds the cores, as the training step's does")
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--testbed-name", default="nrsched")
    ap.add_argument("--subnet", default="10.77.34.0/24")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    import tempfile
    from netreduce.testbed import Testbed
    trees = [("main", ROOT)] + [tuple(c.split("=", 1)) for c in args.code]
    runs = []
    with Testbed(hosts=args.np, rate=args.rate, name=args.testbed_name, subnet=args.subnet,
                 mtu=args.mtu, replace=True) as tb:
        for k in range(args.runs):
            order = trees if k % 2 == 0 else trees[::-1]
            rec = {"run": k, "arms": {}}
            for name, tree in order:
                with tempfile.TemporaryDirectory() as tmp:
                    rec["arms"][name] = run_arm(tb, tree, args, tmp)
                a = rec["arms"][name]
                print(f"run {k} {name}: end {a.get('end_ms', 0):.1f} ms (submitted by "
                      f"{a.get('submit_ms', 0):.1f}), rank 0 CPU {a.get('cpu_ms', 0):.1f} ms; "
                      f"load {a.get('load', 0):.1f} {a.get('error', '')}", flush=True)
            runs.append(rec)
    summary = {}
    for name, _ in trees:
        ends = [r["arms"][name]["end_ms"] for r in runs if "end_ms" in r["arms"][name]]
        if ends:
            summary[name] = {"end_ms": statistics.median(ends), "min": min(ends), "max": max(ends)}
    for name, _ in trees[1:]:
        rs = [r["arms"][name]["end_ms"] / r["arms"]["main"]["end_ms"] for r in runs
              if "end_ms" in r["arms"][name] and "end_ms" in r["arms"]["main"]]
        if rs:
            summary[f"{name}_over_main"] = spread(rs)
    s_bytes = 4 * sum(RESNET18)
    summary["S_over_R_ms"] = s_bytes * 8 / float(args.rate.replace("gbit", "e9").replace("mbit", "e6")) * 1e3
    print(json.dumps(summary, indent=1))
    if args.out:
        write_record(args.out, summary, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
