"""One rank of the testbed data-plane test; runs inside a host namespace.

    python dataplane_worker.py HOST PORT JOB RANK SIZE

Checks, against a numpy reference, every result it gets: rank r contributes r (the
sum must be N(N-1)/2 everywhere) and seeded random data (every rank can compute
every other rank's contribution, hence the exact reference). Prints one JSON line."""
import json
import sys

import numpy as np

from netreduce.worker import dataplane

host, port, job, rank, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
conn = dataplane.connect((host, port), job=job, rank=rank, size=size, timeout=60.0)
failures = []
checked = 0
# 0, 1, odd lengths, and several MiB so that many slots and shadow sets are cycled.
for count in (0, 1, 4093, 16411, 1_000_003, 4 << 20):
    for dtype in (np.float32, np.int32):
        src = np.full(count, rank, dtype=dtype)
        out = conn.allreduce(src, np.empty_like(src))
        if count and not np.all(out == size * (size - 1) // 2):
            bad = np.flatnonzero(out != size * (size - 1) // 2)
            failures.append(f"rank-sum {dtype.__name__} x{count}: {bad.size} wrong elements, "
                            f"first at {bad[0]} (got {out[bad[0]]})")
        checked += 1
        if dtype is np.int32:
            gens = [np.random.default_rng(1000 * count + r) for r in range(size)]
            parts = [g.integers(-1000, 1000, count, dtype=np.int32) for g in gens]
            out = conn.allreduce(parts[rank].copy(), np.empty(count, np.int32))
            want = np.sum(parts, axis=0, dtype=np.int32)
            if not np.array_equal(out, want):
                bad = np.flatnonzero(out != want)
                failures.append(f"random int32 x{count}: {bad.size} wrong elements, first at {bad[0]} "
                                f"(got {out[bad[0]]}, want {want[bad[0]]}), last at {bad[-1]}")
            checked += 1
stats = conn.stats()
conn.close()
print(json.dumps({"rank": rank, "checked": checked, "failures": failures, "stats": stats}), flush=True)
