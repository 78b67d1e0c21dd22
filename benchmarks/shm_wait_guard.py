"""The shared-memory all-reduce alone (native Hierarchical, no aggregator) on one host:
ms and CPU per call, to guard changes to its waits.

    python benchmarks/shm_wait_guard.py TREE N COUNT ITERS [COMPUTE_MS]

TREE is the checkout whose netreduce._native runs (a worktree of main for the base);
N fork()ed ranks all-reduce COUNT float32 ITERS times. With COMPUTE_MS, rank r first
busy-loops COMPUTE_MS × (r + 1) before each call (the ranks arrive skewed); that
compute is left out of both figures. Prints one JSON line: the slowest rank's ms per
call, all ranks' process CPU µs per call, each rank's futex sleeps (-1: no such stat)."""
import json
import multiprocessing as mp
import os
import resource
import sys
import time


def rank(r, args, q_seg, q_out):
    import numpy as np

    from netreduce import _native
    tree, n, count, iters, compute_ms = args
    if r == 0:
        seg = _native.ShmSegment.create(n, n * (256 << 10), 2)
        for _ in range(n - 1):
            q_seg.put((os.getpid(), seg.fd, seg.nonce))
    else:
        pid, fd, nonce = q_seg.get(timeout=30)
        seg = _native.ShmSegment.attach(pid, fd, nonce, r)
    h = _native.Hierarchical(seg, None, list(range(n)), "guard", 30.0)
    h.start(30.0)
    a = np.full(count, r, np.float32)
    b = np.empty_like(a)
    f32, add = _native.DTYPES["float32"], _native.OPS["sum"]
    for _ in range(3):
        h.allreduce(a, b, f32, add)
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    busy = busy_cpu = 0.0
    for _ in range(iters):
        if compute_ms:
            t, tc = time.perf_counter(), time.process_time()
            while time.perf_counter() - t < compute_ms / 1e3 * (1 + r):
                pass
            busy += time.perf_counter() - t
            busy_cpu += time.process_time() - tc
        h.allreduce(a, b, f32, add)
    t1 = time.perf_counter()
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime) - busy_cpu
    assert b[0] == n * (n - 1) / 2
    q_out.put((r, (t1 - t0 - busy) / iters * 1e3, cpu / iters * 1e6,
               h.stats().get("sleeps", -1)))


def main() -> None:
    tree, n, count, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    compute_ms = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    sys.path.insert(0, os.path.abspath(tree))
    from netreduce import _native
    assert _native.__file__.startswith(os.path.abspath(tree)), _native.__file__
    ctx = mp.get_context("fork")
    q_seg, q_out = ctx.Queue(), ctx.Queue()
    args = (tree, n, count, iters, compute_ms)
    procs = [ctx.Process(target=rank, args=(r, args, q_seg, q_out)) for r in range(n)]
    for p in procs:
        p.start()
    got = sorted(q_out.get(timeout=600) for _ in range(n))
    for p in procs:
        p.join()
    print(json.dumps({"tree": tree, "n": n, "count": count, "compute_ms": compute_ms,
                      "ms": max(g[1] for g in got), "cpu_us_all_ranks": sum(g[2] for g in got),
                      "sleeps": [g[3] for g in got]}))


if __name__ == "__main__":
    main()
