"""One rank of the link-bound nap test; runs inside a host namespace.

    python nap_worker.py HOST PORT JOB RANK SIZE

First 50 all-reduces of 4 KiB (never link-bound: no nap may be taken), then large
ones, whose results must be exact (rank r contributes r, and seeded random int32
against the sum every rank can compute). Prints one JSON line with the engine's nap
counts after each phase.

The large ones run in rounds, up to MAX_ROUNDS, until every rank has napped: a
message naps only where its engine keeps up with the link (engine/nap.h: a wake-up
takes at most 1.5 coalesced receives), and on a loaded host the CPU often binds
instead -- rightly no nap then (load 19-20: one rank of two took none in 2 of 4
runs of one round; load 30: a run needed 2 rounds). The ranks agree to stop with a
one-element all-reduce (a small message: it never naps); every round's results are
checked."""
import json
import sys

import numpy as np

from netreduce.worker import dataplane

host, port, job, rank, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
conn = dataplane.connect((host, port), job=job, rank=rank, size=size, timeout=60.0)
failures = []
want = size * (size - 1) // 2
for _ in range(50):
    out = conn.allreduce(np.full(1024, rank, np.float32), np.empty(1024, np.float32))
    if not np.all(out == want):
        failures.append("4 KiB rank-sum wrong")
small_naps = conn.stats()["naps"]
MAX_ROUNDS = 5
rounds = 0
while rounds < MAX_ROUNDS:
    rounds += 1
    for count in (4 << 20, 3_000_017):
        src = np.full(count, rank, np.float32)
        out = conn.allreduce(src, np.empty_like(src))
        if not np.all(out == want):
            failures.append(f"rank-sum float32 x{count}: {np.count_nonzero(out != want)} wrong")
        parts = [np.random.default_rng(7 * count + r).integers(-1000, 1000, count, dtype=np.int32)
                 for r in range(size)]
        mine = parts[rank].copy()
        out = conn.allreduce(mine, mine)  # in place
        if not np.array_equal(out, np.sum(parts, axis=0, dtype=np.int32)):
            failures.append(f"random int32 x{count} in place: wrong")
    napped = np.array([conn.stats()["naps"] > small_naps], np.int32)
    if conn.allreduce(napped)[0] == size:  # every rank has napped
        break
stats = conn.stats()
conn.close()
print(json.dumps({"rank": rank, "failures": failures, "small_naps": small_naps, "naps": stats["naps"],
                  "nap_us": stats["nap_us"], "nap_offs": stats["nap_offs"], "waits": stats["waits"],
                  "rounds": rounds}),
      flush=True)
