#!/usr/bin/env python3
"""Where a steady 4 KiB public-API step's time goes on rank 0 (issue 33): Python before
the engine, the engine (the native call, waiting for the peers included), Python after.

    python3 benchmarks/latency_split.py --code . --np 2 [--pin] [--mode split|raw|cprofile]

N ranks on this host as ``control_plane.py step`` runs them (the code at ``--code``, its
own netreduce-switch, NETREDUCE_CYCLE_TIME 1). Rank 0 replaces the algorithm's native
object with a proxy that takes ``perf_counter_ns`` around its ``allreduce`` /
``vote_step`` on the user's thread (~0.3 µs each), and around each ``nr.allreduce``;
prints one JSON line: medians and means of the three parts, the step, and rank 0's CPU
per step (every thread). ``--pin``: rank r on CPU r mod the CPUs (what mpirun's
--bind-to core does). ``--mode raw``: the algorithm alone (``dp.allreduce``);
``cprofile``: rank 0 under cProfile (its overhead included), top functions on stderr.
``--api torch``: the step is ``hvd.allreduce`` of a 1024-element float32 tensor through
netreduce.torch (Horovod's API) instead of ``nr.allreduce`` of the numpy array; the
split then shows the adapter's Python before and after the engine.
Auto algorithm only (one host: shared memory, native/algorithms/hierarchical.cc).
"""
import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(a: argparse.Namespace) -> None:
    if a.pin:
        os.sched_setaffinity(0, {int(os.environ["NETREDUCE_RANK"]) % os.cpu_count()})
    import numpy as np

    import netreduce as nr
    if a.api == "torch":
        import torch

        import netreduce.torch as hvd
        hvd.init()
    else:
        nr.init()
    comm = nr.api._g.comm
    ev: list = []
    clock = time.perf_counter_ns
    main = threading.get_ident()
    dp = comm.dp
    native = getattr(dp, "_native", None)
    if native is not None:
        class Proxy:
            def _timed(self, fn, *x):
                t0 = clock()
                r = fn(*x)
                t1 = clock()
                if threading.get_ident() == main:
                    ev.extend((t0, t1))
                return r

            def allreduce(self, *x):
                return self._timed(native.allreduce, *x)

            def vote_step(self, *x):
                return self._timed(native.vote_step, *x)

            def __getattr__(self, k):
                return getattr(native, k)
        dp._native = Proxy()
    x = np.ones(1024, np.float32)
    if a.mode == "raw":
        nr.allreduce(x, name="sync")
        fn = lambda: dp.allreduce(x, None, op="sum")  # noqa: E731
    elif a.api == "torch":
        t = torch.ones(1024)
        fn = lambda: hvd.allreduce(t, name="g", op=hvd.Sum)  # noqa: E731
    else:
        fn = lambda: nr.allreduce(x, name="g", op=nr.Sum)  # noqa: E731
    for _ in range(a.warmup):
        fn()
    ev.clear()
    steps = []
    prof = None
    if a.mode == "cprofile" and nr.rank() == 0:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(a.iters):
        t0 = clock()
        fn()
        steps.append((t0, clock()))
    cpu = (time.process_time() - c0) / a.iters * 1e6
    wall = (time.perf_counter() - w0) / a.iters * 1e6
    if prof:
        prof.disable()
    r = nr.rank()
    nr.shutdown()
    if r != 0:
        return
    pre, eng, post = [], [], []
    for t0, t1 in steps:  # the native call inside each step (the user thread's only one)
        j = bisect.bisect_left(ev, t0)
        if j + 1 < len(ev) and ev[j + 1] <= t1:
            pre.append((ev[j] - t0) / 1e3)
            eng.append((ev[j + 1] - ev[j]) / 1e3)
            post.append((t1 - ev[j + 1]) / 1e3)
    out = {"code": a.code, "api": a.api, "np": int(os.environ["NETREDUCE_SIZE"]), "mode": a.mode,
           "pin": a.pin, "load": os.getloadavg()[0],
           "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "cpu_us_per_step": round(cpu, 1), "wall_us_per_step": round(wall, 1),
           "step_median_us": round(statistics.median((b - t) / 1e3 for t, b in steps), 1),
           "paired": len(pre)}
    for k, v in (("before", pre), ("engine", eng), ("after", post)):
        if v:
            out[k] = {"median_us": round(statistics.median(v), 1),
                      "mean_us": round(statistics.mean(v), 1)}
    print(json.dumps(out), flush=True)
    if prof:
        import io
        import pstats
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
        print(s.getvalue(), file=sys.stderr)


def drive(a: argparse.Namespace) -> None:
    sys.path.insert(0, HERE)
    from control_plane import _spawn_switch
    code = os.path.abspath(a.code)
    switch, addr = _spawn_switch(code)
    job = "ls-" + uuid.uuid4().hex[:6]
    try:
        procs = [subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "--mode", a.mode,
             "--iters", str(a.iters), "--warmup", str(a.warmup), "--code", code,
             "--api", a.api]
            + (["--pin"] if a.pin else []), stdout=subprocess.PIPE, text=True, cwd=code,
            env=dict(os.environ, PYTHONPATH=code, NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(a.np),
                     NETREDUCE_LOCAL_RANK=str(r), NETREDUCE_LOCAL_SIZE=str(a.np),
                     NETREDUCE_SWITCH=addr, NETREDUCE_JOB=job, NETREDUCE_CYCLE_TIME="1",
                     NETREDUCE_CACHE_AGREEMENT="0" if a.mode == "raw" else "1"))
            for r in range(a.np)]
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        switch.terminate()
        switch.wait()
    line = outs[0].strip().splitlines()[-1]
    print(line, flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(line + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--code", default=os.path.dirname(HERE))
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--mode", default="split", choices=("split", "raw", "cprofile"))
    p.add_argument("--pin", action="store_true")
    p.add_argument("--api", default="numpy", choices=("numpy", "torch"))
    p.add_argument("--iters", type=int, default=5000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--json", default="", help="append the JSON line to this file")
    p.add_argument("--worker", action="store_true")
    a = p.parse_args()
    (worker if a.worker else drive)(a)


if __name__ == "__main__":
    main()
