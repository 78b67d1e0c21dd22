"""A process's CPU and context switches per thread, between two points of its run
(benchmarks/overlap_frameworks.py's ranks): per thread name, since TensorFlow's pools
name their threads alike and netreduce's engine, executor and agreement threads have
their own. Read through netreduce/testbed/proc_stat.py of this checkout (common.py
loads it), whichever netreduce the process runs."""
from __future__ import annotations

from typing import Any, Dict, List


def threads_cpu() -> Dict[int, Any]:
    """This process's threads now: {tid: (name, CPU-seconds, [voluntary, nonvoluntary]
    context switches)} (/proc/self/task)."""
    from common import proc_stat  # this checkout's, whichever netreduce the rank runs

    def switches(tid: int) -> List[int]:
        try:
            return list(proc_stat.ctx_switches("self", tid))
        except OSError:
            return [0, 0]  # ended meanwhile
    return {t.pid: (t.comm, t.cpu_seconds, switches(t.pid)) for t in proc_stat.threads("self")}


def own_cpu(before: Dict[int, Any], steps: int) -> Dict[str, Any]:
    """This process's CPU-seconds per step since ``before`` (``threads_cpu``): the
    whole process's, and per thread name (TensorFlow's pools name their threads
    alike; netreduce's engine, executor and agreement threads have their own)."""
    names: Dict[str, List[float]] = {}
    switches: Dict[str, List[float]] = {}  # per thread name: [voluntary, nonvoluntary]
    for tid, (name, cpu, ctx) in threads_cpu().items():
        _, cpu0, ctx0 = before.get(tid, (name, 0.0, [0, 0]))
        names.setdefault(name, []).append(cpu - cpu0)
        acc = switches.setdefault(name, [0.0, 0.0])
        acc[0] += ctx[0] - ctx0[0]
        acc[1] += ctx[1] - ctx0[1]
    per = {n: round(sum(v) / steps, 4) for n, v in names.items() if sum(v) > 0}
    return {"cpu_s_per_step": round(sum(per.values()), 4),
            "threads": {n: len(v) for n, v in names.items()},
            "by_thread_name": dict(sorted(per.items(), key=lambda kv: -kv[1])),
            "ctx_switches_per_step": {n: [round(v / steps, 1), round(nv / steps, 1)]
                                      for n, (v, nv) in switches.items() if v + nv > 0}}

