"""One worker process that runs a plan of all-reduces and checks every element.

Run by the Soft-RoCE tests inside the QEMU guest (verbs transport on rxe0) and, for
the benchmark, on either transport. Usage: guest_worker.py PLAN.json OUT.json, where
PLAN holds {"phases": [{"switch": "ip:port", "job": ..., "rank": r, "size": n,
"cases": [[dtype, count], ...], "repeat": 1}]}. Rank r contributes
pattern(count) * (r + 1), so every element of the sum is pattern * n(n+1)/2."""
from __future__ import annotations

import glob
import json
import os
import resource
import sys
import time
import traceback

import numpy as np


def pattern(count: int, dtype: str) -> np.ndarray:
    return (np.arange(count, dtype=np.int64) % 97 + 1).astype(dtype)


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rdma_counters() -> dict:
    """The hw_counters of every RDMA port (Soft-RoCE: rxe0/1), name -> value."""
    out = {}
    for d in glob.glob("/sys/class/infiniband/*/ports/*/hw_counters/*"):
        try:
            out[os.path.basename(d)] = int(open(d).read())
        except (OSError, ValueError):
            pass
    return out


def run_phase(phase: dict) -> dict:
    from netreduce.worker import dataplane
    host, port = phase["switch"].rsplit(":", 1)
    rank, size = int(phase["rank"]), int(phase["size"])
    out = {"job": phase["job"], "cases": [], "ok": True}
    before = rdma_counters()
    conn = dataplane.connect((host, int(port)), phase["job"], rank, size,
                             timeout=float(phase.get("timeout", 240)))
    try:
        for dtype, count in phase["cases"]:
            base = pattern(count, dtype)
            src = base * (rank + 1)
            want = base * (size * (size + 1) // 2)
            repeat = int(phase.get("repeat", 1))
            dst = np.empty_like(src)
            cpu0, t0 = cpu_seconds(), time.perf_counter()
            for _ in range(repeat):
                conn.allreduce(src, dst)
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
            bad = int(np.count_nonzero(dst != want))
            out["cases"].append({"dtype": dtype, "count": count, "mismatches": bad,
                                 "bytes": int(src.nbytes) * repeat, "wall_s": wall, "cpu_s": cpu})
            out["ok"] = out["ok"] and bad == 0
        out["stats"] = {k: int(v) for k, v in conn.stats().items()}
        verbs = getattr(conn, "_verbs", None)
        out["transport"] = "verbs" if verbs is not None and verbs.transport is not None else "udp"
        if out["transport"] == "verbs":
            out["verbs"] = {k: v for k, v in verbs.transport.info().items()}
    finally:
        conn.close()
    after = rdma_counters()
    out["rdma_counters"] = {k: v - before.get(k, 0) for k, v in after.items()}
    return out


def main() -> int:
    plan = json.load(open(sys.argv[1]))
    results = {"phases": [], "ok": True}
    for phase in plan["phases"]:
        for k, v in phase.get("env", {}).items():
            os.environ[k] = str(v)  # knobs of this phase (NETREDUCE_TRANSPORT=udp|verbs)
        try:
            r = run_phase(phase)
        except Exception as exc:
            r = {"job": phase["job"], "ok": False, "error": f"{type(exc).__name__}: {exc}",
                 "traceback": traceback.format_exc()}
        results["phases"].append(r)
        results["ok"] = results["ok"] and r["ok"]
        with open(sys.argv[2], "w") as f:
            json.dump(results, f, indent=1)
        print(f"phase {phase['job']}: {'ok' if r['ok'] else 'FAILED'} {r.get('error', '')}", flush=True)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
