#!/usr/bin/env python3
"""Where a steady 4 KiB public-API step spends its time, inside one rank (issue 15).

    PYTHONPATH=. python benchmarks/step_breakdown.py --code . --algorithm auto
    PYTHONPATH=. python benchmarks/step_breakdown.py --code /tmp/nr-before-lat

N ranks on this host, as benchmarks/control_plane.py step runs them (the code at
``--code``, its own netreduce-switch); rank 0 wraps the functions a step passes
through (the API call, submit, the agreement's route/help/round, the executor's queue
wake-ups, every data-plane all-reduce, the handle's completion) with timestamps and
prints, per pair of consecutive events, the median and mean gap over the steps: the
gap between ``dp>`` and ``dp<`` is a data-plane all-reduce (R: a round's int32 vector,
G: the data), ``submit< -> woke`` a hand-off to the executor, and so on. The wrappers
cost a few µs each; the totals are for reading the parts, not for the headline
figure (control_plane.py step). The first lines also give the CPU rank 0 used per
step (all its threads): N ranks on C cores cannot step faster than N x that / C.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    import netreduce as nr
    from netreduce.worker import communicator as cm
    try:
        from netreduce.worker import agreement as rc
    except ImportError:  # a checkout from before Agreement had its own file
        from netreduce.worker import response_cache as rc
    events = []
    clock = time.perf_counter_ns

    def wrap(obj, name, label):
        if not hasattr(obj, name):
            return  # an older checkout without it
        fn = getattr(obj, name)

        def timed(*a, **k):
            events.append((label + ">", clock()))
            try:
                return fn(*a, **k)
            finally:
                events.append((label + "<", clock()))
        setattr(obj, name, timed)

    try:  # the executor's wake-ups: WakeQueue.take, or the module function of older trees
        from netreduce.worker.wake_queue import WakeQueue
        owner, attr = WakeQueue, "take"
    except ImportError:
        owner, attr = rc, "_take"
    take = getattr(owner, attr)

    def woke(q, wait):
        items = take(q, wait)
        if items:
            events.append(("woke", clock()))
        return items
    setattr(owner, attr, woke)
    try:
        from netreduce.worker.handle import Handle
    except ImportError:  # older trees kept it in the communicator
        Handle = cm.Handle
    wrap(Handle, "_finish_one", "finish")
    nr.init()
    comm = nr.api._g.comm
    wrap(comm, "submit", "submit")
    if comm.agreement is not None:
        for name, label in (("route", "route"), ("help", "help"), ("_round", "round")):
            wrap(comm.agreement, name, label)
    dp_allreduce = comm.dp.allreduce

    def dp(src, *a, **k):
        label = "dpR" if src.dtype == np.int32 else "dpG"
        events.append((label + ">", clock()))
        try:
            return dp_allreduce(src, *a, **k)
        finally:
            events.append((label + "<", clock()))
    comm.dp.allreduce = dp
    x = np.ones(1024, np.float32)
    for _ in range(args.warmup):
        nr.allreduce(x, name="g", op=nr.Sum)
    events.clear()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(args.iters):
        events.append(("call>", clock()))
        nr.allreduce(x, name="g", op=nr.Sum)
        events.append(("call<", clock()))
    # CPU this process used per step, all threads (wrappers included): with N ranks on
    # C cores, a step cannot take less than N x this / C while the ranks are busy
    cpu_us = (time.process_time() - cpu0) / args.iters * 1e6
    wall_us = (time.perf_counter() - wall0) / args.iters * 1e6
    rank = nr.rank()
    nr.shutdown()
    if rank != 0:
        return
    gaps, step = {}, []
    for label, t in events:
        step.append((label, t))
        if label == "call<":
            for (a, ta), (b, tb) in zip(step, step[1:]):
                gaps.setdefault(f"{a} -> {b}", []).append((tb - ta) / 1e3)
            gaps.setdefault("TOTAL", []).append((step[-1][1] - step[0][1]) / 1e3)
            step = []
    steps = len(gaps["TOTAL"])
    rows = sorted(gaps.items(), key=lambda kv: -sum(kv[1]))
    print(json.dumps({"steps": steps, "load": os.getloadavg()[0], "cpu_us": round(cpu_us, 1),
                      "wall_us": round(wall_us, 1), "cores": os.cpu_count(), "gaps": {
        k: {"n": len(v), "median_us": round(statistics.median(v), 1),
            "per_step_mean_us": round(sum(v) / steps, 1)} for k, v in rows}}), flush=True)


def drive(args: argparse.Namespace) -> None:
    sys.path.insert(0, HERE)
    from control_plane import _spawn_switch
    code = os.path.abspath(args.code)
    switch, addr = _spawn_switch(code)
    job = "bd-" + uuid.uuid4().hex[:6]
    try:
        procs = [subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "--iters", str(args.iters),
             "--warmup", str(args.warmup)], stdout=subprocess.PIPE, text=True, cwd=code,
            env=dict(os.environ, PYTHONPATH=code, NETREDUCE_RANK=str(r),
                     NETREDUCE_SIZE=str(args.np), NETREDUCE_LOCAL_RANK=str(r),
                     NETREDUCE_LOCAL_SIZE=str(args.np), NETREDUCE_SWITCH=addr,
                     NETREDUCE_JOB=job, NETREDUCE_ALGORITHM=args.algorithm,
                     NETREDUCE_CYCLE_TIME=args.cycle))
            for r in range(args.np)]
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        switch.terminate()
        switch.wait()
    rec = json.loads(outs[0].strip().splitlines()[-1])
    print(f"# {code} algorithm={args.algorithm} cycle={args.cycle} N={args.np}, "
          f"{rec['steps']} steps, load {rec['load']:.1f}; rank 0, µs")
    if "cpu_us" in rec:
        print(f"# rank 0 used {rec['cpu_us']:.1f} µs CPU per step (all threads) of a "
              f"{rec['wall_us']:.1f} µs step; {args.np} ranks x that / {rec['cores']} cores "
              f"= {args.np * rec['cpu_us'] / rec['cores']:.1f} µs")
    for key, v in rec["gaps"].items():
        print(f"{key:28s} n={v['n']:5d}  median {v['median_us']:8.1f}  "
              f"per-step mean {v['per_step_mean_us']:8.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--code", default=os.path.dirname(HERE))
    p.add_argument("--algorithm", default="auto")
    p.add_argument("--cycle", default="1")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--worker", action="store_true")
    args = p.parse_args()
    (worker if args.worker else drive)(args)


if __name__ == "__main__":
    main()
