"""benchmarks/control_plane.py ``step``: N=4 ranks on this host through the public
API, one 4 KiB all-reduce per step, every variant (before, coordinator, agreement,
dataplane, failover-*) interleaved in the same run."""
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

from control_plane_daemon import spawn_switch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "control_plane.py")  # the workers' command line


def worker_step(args: argparse.Namespace) -> None:
    import numpy as np

    import netreduce as nr
    nr.init()
    x = np.ones(1024, np.float32)
    if args.raw:  # the algorithm alone, as the executor calls it
        dp = nr.api._g.comm.dp
        run = lambda: dp.allreduce(x, None, op="sum")  # noqa: E731
        nr.allreduce(x, name="sync")                    # then nothing else negotiates
    else:
        run = lambda: nr.allreduce(x, name="g", op=nr.Sum)  # noqa: E731
    import resource
    for _ in range(args.warmup):
        run()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    for _ in range(args.iters):
        run()
    per = (time.perf_counter() - t) / args.iters
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    # the whole process (every thread) per all-reduce: steadier than the time when the
    # machine is shared
    cpu_us = ((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)) \
        / args.iters * 1e6
    ag = nr.api._g.comm.agreement
    spec = getattr(ag, "spec", None)  # absent in checkouts before speculation
    print(json.dumps({"rank": nr.rank(), "ms": per * 1e3, "cpu_us": cpu_us,
                      "rounds": getattr(ag, "rounds", 0),
                      "speculative": getattr(spec, "hits", 0)}), flush=True)
    nr.shutdown()


VARIANTS = {  # name -> (code, env)
    "before": ("before", {}),
    "coordinator": ("after", {"NETREDUCE_CACHE_AGREEMENT": "0"}),
    "agreement": ("after", {"NETREDUCE_CACHE_AGREEMENT": "1"}),
    # no rounds either: the executor stays idle while the script calls the algorithm
    "dataplane": ("after", {"RAW": "1", "NETREDUCE_CACHE_AGREEMENT": "0"}),
    # failover on (the job's own aggregator as its standby, rendezvous at rank 0)
    "failover-coordinator": ("after", {"STANDBY": "1", "NETREDUCE_CACHE_AGREEMENT": "0"}),
    "failover-agreement": ("after", {"STANDBY": "1", "NETREDUCE_CACHE_AGREEMENT": "1"}),
}


def _one_step_run(code_path: str, addr: str, env_extra: Dict[str, str], args,
                  cpu: Any = None) -> float:
    """The slowest rank's ms per all-reduce; ``cpu`` (a list) gets the ranks' summed
    CPU µs per all-reduce."""
    job = uuid.uuid4().hex[:8]
    from netreduce.process import free_tcp_port
    rendezvous = f"127.0.0.1:{free_tcp_port()}"
    procs = []
    for r in range(args.np):
        env = dict(os.environ, PYTHONPATH=code_path, NETREDUCE_RANK=str(r),
                   NETREDUCE_SIZE=str(args.np), NETREDUCE_LOCAL_RANK=str(r),
                   NETREDUCE_LOCAL_SIZE=str(args.np), NETREDUCE_SWITCH=addr,
                   NETREDUCE_JOB=job, **env_extra)
        raw = env.pop("RAW", None)
        if env.pop("STANDBY", None):
            env.update(NETREDUCE_STANDBY_SWITCH=addr, NETREDUCE_RENDEZVOUS=rendezvous)
        cmd = [sys.executable, SCRIPT, "worker-step",
               "--iters", str(args.iters), "--warmup", str(args.warmup)]
        procs.append(subprocess.Popen(cmd + (["--raw"] if raw else []), env=env,
                                      stdout=subprocess.PIPE, text=True, cwd=code_path))
    ms, cpu_us = [], 0.0
    for p in procs:
        out, _ = p.communicate(timeout=600)
        lines = out.strip().splitlines()
        last = json.loads(lines[-1]) if p.returncode == 0 and lines else {}
        ms.append(last.get("ms", float("nan")))
        cpu_us += last.get("cpu_us", float("nan"))
    if cpu is not None:
        cpu.append(cpu_us)
    return max(ms)


def _print_over_dataplane(table, first_cycle, fmt):
    """Each agreement/before cell of ``table`` less its algorithm's dataplane cell (at
    the first cycle), per repeat (the cells of a repeat ran back to back)."""
    for key, vals in table.items():
        alg, cycle, name = key.split()
        floor = table.get(f"{alg} cycle={first_cycle} dataplane")
        if name in ("agreement", "before") and floor:
            extra = [v - f for v, f in zip(vals, floor)]
            print(f"{f'{alg} {cycle} {name} - dataplane':40s} {statistics.median(extra):7{fmt}}  "
                  f"[{' '.join(f'{v:{fmt}}' for v in extra)}]")


def drive_step(args: argparse.Namespace) -> None:
    paths = {"after": REPO, "before": args.before}
    names = [v for v in args.variants.split(",") if v != "before" or args.before]
    switches = {k: spawn_switch(p) for k, p in paths.items() if p}
    results: Dict[str, List[float]] = {}
    cpu: Dict[str, List[float]] = {}
    try:
        for _ in range(args.repeat):  # interleaved: every cell once per repeat
            for alg in args.algorithms.split(","):
                for cycle in args.cycles.split(","):
                    for name in names:
                        if name == "dataplane" and cycle != args.cycles.split(",")[0]:
                            continue
                        code, env = VARIANTS[name]
                        env = dict(env, NETREDUCE_ALGORITHM=alg, NETREDUCE_CYCLE_TIME=cycle)
                        key = f"{alg} cycle={cycle} {name}"
                        ms = _one_step_run(paths[code], switches[code][1], env, args,
                                           cpu.setdefault(key, []))
                        results.setdefault(key, []).append(ms)
    finally:
        for proc, _ in switches.values():
            proc.terminate()
            proc.wait()
    print(f"# N={args.np}, 4 KiB float32, {args.iters} iters x {args.repeat} runs, "
          f"load {os.getloadavg()[0]:.1f}; ms per all-reduce (slowest rank), median [runs]")
    for key, vals in results.items():
        print(f"{key:40s} {statistics.median(vals):7.3f}  "
              f"[{' '.join(f'{v:.3f}' for v in vals)}]")
    # What negotiation adds per step: the public-API step minus the algorithm alone
    # (the target: <= 0.1 ms); per repeat, as the cells of a repeat ran back to back.
    first = args.cycles.split(",")[0]
    _print_over_dataplane(results, first, ".3f")
    print("# CPU µs per all-reduce, all ranks' processes summed (every thread), median [runs]")
    for key, vals in cpu.items():
        print(f"{key:40s} {statistics.median(vals):7.1f}  [{' '.join(f'{v:.1f}' for v in vals)}]")
    _print_over_dataplane(cpu, first, ".1f")  # the control cost of a step in CPU, per repeat
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "load": os.getloadavg(),
                       "results": results, "cpu_us": cpu}, f, indent=1)
