"""One rank of the NaN / signed-zero test of min and max (tests/parallel/test_nan_minmax.py),
started with NETREDUCE_* in its environment (which path the job takes: flat through
the aggregator, deterministic, hierarchical shared memory, the host all-reduce).
Through the public API; prints one JSON line: what it checked and the path, or the
first difference.

Rank r's data holds NaN where the other's does not, where both do, and zeros of both
signs against each other, infinities and ordinary values; the expected result is
numpy's np.minimum / np.maximum over the ranks' arrays (NaN wherever either holds it),
with zeros of equal value signed as IEEE 754-2019 minimum / maximum have them
(min(-0, +0) = -0, max(-0, +0) = +0, in either order: numpy's own sign there follows
its argument order and dtype)."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import netreduce as nr  # noqa: E402
from tests.bf16 import from_bf16, to_bf16  # noqa: E402

COUNT = 1003  # whole vectors and a tail, in one packet
DTYPES = ("float32", "float64", "float16", "bfloat16")


def values(rank: int, size: int) -> np.ndarray:
    """Rank `rank`'s values as float64, exact in every dtype (halves below 128 fit
    bfloat16's 8 bits); position i % 8 says what meets there (below)."""
    rng = np.random.default_rng([11, rank])
    v = rng.integers(-256, 256, COUNT).astype(np.float64) / 2
    v[rng.random(COUNT) < 0.05] = np.inf * (1 - 2 * rank)
    i = np.arange(COUNT)
    k = i % 8
    v[(k == 0) & (i // 8 % size == rank)] = np.nan  # one rank holds NaN, each in turn
    v[k == 1] = np.nan                             # every rank holds NaN
    v[k == 2] = 0.0 if rank % 2 == 0 else -0.0     # zeros of both signs meet
    v[k == 3] = -0.0 if rank % 2 == 0 else 0.0
    v[k == 4] = -0.0                               # all -0 / all +0
    v[k == 5] = 0.0
    return v


def expected(op: str, size: int) -> np.ndarray:
    parts = [values(r, size) for r in range(size)]
    fold = np.minimum if op == "min" else np.maximum
    out = parts[0]
    for p in parts[1:]:
        out = fold(out, p)
    zero = out == 0  # IEEE: min of zeros is -0 if any is, max is +0 if any is
    signs = np.array([np.signbit(p) for p in parts])
    neg = signs.any(axis=0) if op == "min" else signs.all(axis=0)
    out[zero] = np.where(neg[zero], -0.0, 0.0)
    return out


def as_dtype(v: np.ndarray, dtype: str) -> np.ndarray:
    return to_bf16(v) if dtype == "bfloat16" else v.astype(dtype)


def as_float(a: np.ndarray, dtype: str) -> np.ndarray:
    return from_bf16(a).astype(np.float64) if dtype == "bfloat16" else a.astype(np.float64)


def main() -> int:
    nr.init()
    rank, size = nr.rank(), nr.size()
    dp = nr.api._comm().dp
    out = {"rank": rank, "algorithm": dp.name, "checked": 0,
           "path_kind": dp.stats().get("path_kind", "")}  # failover's: "host" for the host's
    try:
        for dtype in DTYPES:
            for op, code in (("min", nr.Min), ("max", nr.Max)):
                mine = as_dtype(values(rank, size), dtype)
                got = as_float(nr.allreduce(mine, op=code, name=f"nan.{dtype}.{op}",
                                            dtype="bfloat16" if dtype == "bfloat16" else None),
                               dtype)
                want = expected(op, size)
                nan_ok = np.isnan(got) == np.isnan(want)
                val_ok = np.isnan(want) | (got == want)
                sign_ok = np.isnan(want) | (np.signbit(got) == np.signbit(want))
                bad = np.flatnonzero(~(nan_ok & val_ok & sign_ok))
                assert bad.size == 0, (f"{dtype} {op}: {bad.size} of {COUNT} differ from numpy, "
                                       f"first at {bad[:4].tolist()}: got {got[bad[:4]].tolist()} "
                                       f"want {want[bad[:4]].tolist()}")
                out["checked"] += 1
    except AssertionError as exc:
        out["failure"] = str(exc)
    finally:
        nr.shutdown()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
