"""One rank of tests/parallel/test_restart_memory.py: the job restarted CYCLES times
through the public API (init, two small all-reduces checked exactly, shutdown);
rank 0 prints the cycle it is at every EVERY cycles, so the test reads the
daemon's RSS at known points."""
from __future__ import annotations

import json
import sys

import numpy as np

import netreduce as nr


def main(cycles: int, every: int) -> int:
    wrong = 0
    for c in range(cycles):
        nr.init()
        try:
            for i in range(2):
                a = np.arange(64, dtype=np.float32) + nr.rank()
                got = nr.allreduce(a, op=nr.Sum, name=f"t{i}")
                want = np.arange(64, dtype=np.float32) * nr.size() + sum(range(nr.size()))
                wrong += int(not np.array_equal(got, want))
        finally:
            nr.shutdown()
        if c % every == 0 or c == cycles - 1:
            print(json.dumps({"cycle": c, "wrong": wrong}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
