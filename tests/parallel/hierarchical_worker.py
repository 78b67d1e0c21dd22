"""One rank of a hierarchical all-reduce test, started as its own process (loopback:
tests/parallel/test_hierarchical.py; testbed: tests/root/test_hierarchical_testbed.py)
with NETREDUCE_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/SWITCH/JOB in its environment. Goes
through the public API, so the communicator, fusion and negotiation are the real
ones. Prints one JSON line: what it checked, or the error it saw.

    python hierarchical_worker.py MODE [ARG]

MODE pattern  rank r contributes r for many sizes (float32, int64): N(N-1)/2 back
     random   every dtype x op, random data against a numpy reference computed from
              every rank's seeded data in the algorithm's order (ARG "exact": values
              whose float sums do not depend on order, for several hosts)
     big      64 MiB of float32 with index-dependent data
     kill     rank ARG SIGKILLs itself mid-operation; the others report the error
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import netreduce as nr  # noqa: E402
from tests.bf16 import from_bf16, to_bf16  # noqa: E402
from netreduce.errors import NetReduceError  # noqa: E402

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
OPS = {"sum": nr.Sum, "min": nr.Min, "max": nr.Max}


def data(dtype: str, rank: int, count: int, seed: int, exact: bool) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    if dtype in ("int32", "int64"):
        return rng.integers(-10**6, 10**6, count).astype(dtype)
    if exact:  # quarter-integers in [-16, 16): every partial sum is representable
        vals = rng.integers(-64, 64, count).astype(np.float32) / 4
    else:
        vals = rng.standard_normal(count).astype(np.float32) * 10
    if dtype == "bfloat16":
        return to_bf16(vals)
    return vals.astype(dtype)


def reference(dtype: str, op: str, parts, hosts) -> np.ndarray:
    """The result in the hierarchical order: per host, local ranks 0..L-1 folded in
    the accumulator type (float32 for 16-bit floats) and rounded to the wire type;
    then the hosts' shards combined the same way (the aggregator's float32
    accumulator). With exact data or one host this order is the only one there is."""
    fold = {"sum": np.add, "min": np.minimum, "max": np.maximum}[op]

    def widen(a):
        if dtype == "bfloat16":
            return from_bf16(a)
        return a.astype(np.float32) if dtype == "float16" else a.copy()

    def narrow(a):
        if dtype == "bfloat16":
            return to_bf16(a)
        return a.astype(np.float16) if dtype == "float16" else a

    per_host = []
    for ranks in hosts:
        acc = widen(parts[ranks[0]])
        for r in ranks[1:]:
            acc = fold(acc, widen(parts[r]))
        per_host.append(narrow(acc))
    if len(per_host) == 1:
        return per_host[0]
    acc = widen(per_host[0])
    for p in per_host[1:]:
        acc = fold(acc, widen(p))
    return narrow(acc)


def main() -> int:
    mode = sys.argv[1]
    arg = sys.argv[2] if len(sys.argv) > 2 else ""
    nr.init()
    rank, size = nr.rank(), nr.size()
    algo = nr.api._comm().dp
    out = {"rank": rank, "algorithm": algo.name, "checked": 0}
    hosts = algo.layout.hosts if hasattr(algo, "layout") else [list(range(size))]
    out["hosts"] = hosts
    if hasattr(algo, "_native"):  # the shared-memory wait's budget as configured
        out["spin_ns"] = algo._native.stats().get("spin_ns")
    digest = hashlib.sha256()
    try:
        if mode == "pattern":
            chunk = int(os.environ.get("NETREDUCE_SHM_CHUNK", "0") or 0)
            sizes = [0, 1, 2, 3, 5, 16373, 16374, 16383, 100003]
            if chunk:
                sizes += [chunk // 4 * size - 1, chunk // 4 * size * 3 + 7]
            for dt in ("float32", "int64"):
                for count in sizes:
                    a = np.full(count, rank, dtype=dt)
                    got = nr.allreduce(a, op=nr.Sum, name=f"p.{dt}.{count}")
                    bad = np.flatnonzero(got != size * (size - 1) // 2)
                    assert bad.size == 0, f"{dt} count {count}: {bad.size} wrong, first {bad[:5]}"
                    digest.update(got.tobytes())
                    out["checked"] += 1
        elif mode == "random":
            exact = arg == "exact"
            count = 70001  # not a multiple of L, of a packet or of a chunk
            for seed, dtype in enumerate(DTYPES):
                for op in OPS:
                    parts = [data(dtype, r, count, seed, exact) for r in range(size)]
                    want = reference(dtype, op, parts, hosts)
                    got = nr.allreduce(parts[rank], op=OPS[op], name=f"r.{dtype}.{op}",
                                       dtype="bfloat16" if dtype == "bfloat16" else None)
                    bits = np.dtype(f"u{got.itemsize}")  # bitwise: same bytes, not just close
                    bad = np.flatnonzero(got.view(bits) != want.view(bits))
                    assert bad.size == 0, (f"{dtype} {op}: {bad.size} of {count} differ, first "
                                           f"at {bad[:3]}: got {got[bad[:3]]} want {want[bad[:3]]}")
                    digest.update(got.tobytes())
                    out["checked"] += 1
        elif mode == "big":
            count = 16 * 2**20  # 64 MiB of float32
            pattern = (np.arange(count, dtype=np.int64) % 4099).astype(np.float32)
            a = pattern + np.float32(rank)
            got = nr.allreduce(a, op=nr.Sum, name="big")
            got -= pattern * size + np.float32(size * (size - 1) / 2)
            bad = np.flatnonzero(got)
            assert bad.size == 0, f"{bad.size} wrong elements, first at {bad[:5]}"
            out["checked"] = 1
        elif mode == "kill":
            victim = int(arg)
            a = np.full(8 * 2**20, rank, dtype=np.float32)
            nr.allreduce(a[:1000], op=nr.Sum, name="warm")  # every rank is in step
            if rank == victim:
                threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGKILL)).start()
            t0 = time.monotonic()
            try:
                for i in range(200):
                    nr.allreduce(a, op=nr.Sum, name=f"k{i}")
                out["error"] = None
            except NetReduceError as exc:
                out["error"] = f"{type(exc).__name__}: {exc}"
                out["error_rank"] = getattr(exc, "rank", None)
            out["seconds"] = time.monotonic() - t0
        else:
            raise SystemExit(f"unknown mode {mode}")
    except AssertionError as exc:
        out["failure"] = str(exc)
    out["digest"] = digest.hexdigest()
    nr.shutdown()
    with open("/proc/self/maps") as f:
        out["segment_mapped"] = "netreduce-hierarchical" in f.read()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
