"""One rank of the --fanout auto testbed test; runs inside a host namespace.

    python fanout_worker.py HOST PORT JOB RANK SIZE COUNT ROUNDS1 ROUNDS2

ROUNDS1 all-reduces of COUNT float32, then a line "PHASE1 <stats JSON>"; waits for a
line on stdin (the test changes the network meanwhile), then ROUNDS2 more. Rank r
contributes r + 1 + i in round i, so every element of every round is checked. Prints
one JSON line: failures, the engine's stats after phase 1 and at the end."""
import json
import sys

import numpy as np

from netreduce.worker import dataplane

host, port, job = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rank, size, count = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rounds1, rounds2 = int(sys.argv[7]), int(sys.argv[8])
conn = dataplane.connect((host, port), job=job, rank=rank, size=size, timeout=60.0)
failures = []


def run(first, n):
    for i in range(first, first + n):
        a = np.full(count, rank + 1 + i, np.float32)
        conn.allreduce(a)
        want = size * (size + 1) // 2 + size * i
        if not (a == want).all():
            bad = np.flatnonzero(a != want)
            failures.append(f"round {i}: {bad.size} wrong elements, first at {bad[0]} (got {a[bad[0]]})")


run(0, rounds1)
phase1 = conn.stats()
print("PHASE1 " + json.dumps(phase1), flush=True)
sys.stdin.readline()
run(rounds1, rounds2)
print(json.dumps({"rank": rank, "failures": failures, "phase1": phase1, "end": conn.stats(),
                  "group_note": conn._engine.group_note}), flush=True)
conn.close()
