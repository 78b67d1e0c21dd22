"""One rank of a several-aggregator job (tests/parallel/test_multi_aggregator.py),
through the public API with NETREDUCE_SWITCH=a,b[,c]. Prints one JSON line.

    python multi_aggregator_worker.py MODE [ARG]

MODE exact   rank r contributes seeded integers and quarter-integers for many sizes
             (below and above the split threshold, not multiples of anything) and
             every dtype x op; each result checked against numpy
     kill    after a first checked all-reduce, waits for the file ARG to appear
             (the test kills an aggregator first), then all-reduces 8 MiB and
             reports the error it gets
"""
from __future__ import annotations

import hashlib
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import netreduce as nr  # noqa: E402
from netreduce.errors import NetReduceError  # noqa: E402
from tests.procs import finish  # noqa: E402

OPS = {"sum": (nr.Sum, np.add), "min": (nr.Min, np.minimum), "max": (nr.Max, np.maximum)}
SIZES = [1, 7, 1000, 65_537, 300_001, 1 << 20]  # elements


def data(dtype: str, rank: int, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    if dtype.startswith("int"):
        return rng.integers(-10**6, 10**6, count).astype(dtype)
    return (rng.integers(-64, 64, count).astype(np.float32) / 4).astype(dtype)


def main() -> None:
    mode = sys.argv[1]
    nr.init()
    rank, size = nr.rank(), nr.size()
    out = {"rank": rank, "checked": 0}
    digest = hashlib.sha256()
    try:
        comm = nr.api._comm()
        out["algorithm"] = comm.dp.name
        out["aggregators"] = len(getattr(comm.dp, "connections", [None]))
        cases = [(d, o, n) for d in ("float32", "float64", "int32", "int64")
                 for o in ("sum", "min", "max") for n in SIZES]
        if mode == "kill":
            cases = cases[:1]
        for seed, (dtype, op, n) in enumerate(cases):
            mine = data(dtype, rank, n, seed)
            got = nr.allreduce(mine, op=OPS[op][0], name=f"t{seed}")
            want = data(dtype, 0, n, seed)
            for r in range(1, size):
                want = OPS[op][1](want, data(dtype, r, n, seed))
            got = np.asarray(got)
            assert got.dtype == want.dtype and np.array_equal(got, want), (dtype, op, n)
            digest.update(got.tobytes())
            out["checked"] += 1
        out["digest"] = digest.hexdigest()
        out["stats"] = {k: v for k, v in comm.dp.stats().items()
                        if "packets" in k or k == "aggregators"
                        or k.endswith(("_retransmits", "_tail_copies"))}
        if mode == "kill":
            flag = sys.argv[2]
            with open(f"{flag}.ready{rank}", "w"):
                pass
            while not os.path.exists(flag):
                time.sleep(0.05)
            start = time.monotonic()
            try:
                nr.allreduce(np.ones(2 << 20, np.float32), name="after-kill")
                out["failure"] = "no error after the aggregator died"
            except NetReduceError as exc:
                out["error"] = str(exc)
                out["error_after_s"] = time.monotonic() - start
    except (NetReduceError, AssertionError) as exc:
        out["failure"] = f"{type(exc).__name__}: {exc}"
    finish(out)


if __name__ == "__main__":
    main()
