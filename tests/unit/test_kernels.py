"""The slot kernels (native/reduce/kernels.cc) against numpy, on each kernel set this
CPU has (generic, and AVX2+F16C where cpuid says so): min and max give NaN wherever
any contribution holds it, whichever side and in whatever order (np.minimum /
np.maximum), and zeros of equal value signed as IEEE 754-2019 minimum / maximum have
them; the order contributions come in changes no bit of a result. Every float dtype
(16-bit ones widened to float32 in the slot); lengths that end in whole vectors and
in tails. The same through every data path: tests/parallel/test_nan_minmax.py."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from netreduce import _native

SIMD = ["generic"] + (["avx2+f16c"] if _native.build_info()["simd"] == "avx2+f16c" else [])
FLOATS = ["float32", "float64", "float16", "bfloat16"]


def _to_wire(v: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":  # exact for the values below: the upper half of a float32
        return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return v.astype(dtype)


def _from_wire(raw: bytes, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, dtype)


def _reduce(dtype: str, op: str, parts, simd: str) -> np.ndarray:
    code = _native.DTYPES[dtype]
    raw = _native.reduce_kernel(code, _native.OPS[op], [_to_wire(p, dtype) for p in parts], simd)
    return _from_wire(raw, dtype).astype(np.float64)


def _special(n: int, rank: int) -> np.ndarray:
    """Everything that meets at once: NaN on one side, the other, both; zeros of each
    sign against each other; infinities; ordinary halves (exact in bfloat16)."""
    rng = np.random.default_rng(rank)
    v = rng.integers(-200, 200, n) / 2.0
    k = np.arange(n) % 9
    v[k == 0] = np.nan if rank == 0 else 1.5
    v[k == 1] = np.nan if rank == 1 else -2.5
    v[k == 2] = np.nan
    v[k == 3] = 0.0 if rank == 0 else -0.0
    v[k == 4] = -0.0 if rank == 0 else 0.0
    v[k == 5] = np.inf if rank == 0 else -np.inf
    v[k == 6] = np.nan if rank == 0 else np.inf
    return v


def _want(op: str, parts) -> np.ndarray:
    fold = np.minimum if op == "min" else np.maximum
    out = parts[0].copy()
    for p in parts[1:]:
        out = fold(out, p)
    zero = out == 0
    signs = np.array([np.signbit(p) for p in parts])
    neg = signs.any(axis=0) if op == "min" else signs.all(axis=0)
    out[zero] = np.where(neg[zero], -0.0, 0.0)
    return out


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Positions where got is not want: NaN where want is, equal values, equal signs."""
    nan = np.isnan(want)
    ok = (np.isnan(got) == nan) & (nan | ((got == want) & (np.signbit(got) == np.signbit(want))))
    return np.flatnonzero(~ok)


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["min", "max"])
def test_nan_and_signed_zeros_as_numpy_whichever_rank_holds_them(simd, dtype, op):
    for n in (1, 7, 8, 9, 33, 1003):  # below a vector, whole vectors, vectors and a tail
        parts = [_special(n, r) for r in range(2)]
        for order in (parts, parts[::-1]):  # rank 0's NaN first, or second
            bad = _same(_reduce(dtype, op, order, simd), _want(op, parts))
            assert bad.size == 0, (simd, dtype, op, n, bad[:5])


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["min", "max"])
def test_arrival_order_changes_no_bit(simd, dtype, op):
    parts = [_special(1003, r) for r in range(3)]
    parts[2][::5] = np.nan  # a third rank's NaNs too
    code = _native.DTYPES[dtype]
    results = {_native.reduce_kernel(code, _native.OPS[op], [_to_wire(p, dtype) for p in perm],
                                     simd)
               for perm in itertools.permutations(parts)}
    assert len(results) == 1


def test_both_kernel_sets_agree_bit_for_bit():
    if len(SIMD) < 2:
        pytest.skip(f"this CPU has no AVX2+F16C ({_native.build_info()['simd']}): one kernel set")
    rng = np.random.default_rng(3)
    for dtype in FLOATS + ["int32", "int64"]:
        for op in ("sum", "min", "max", "product"):
            if dtype.startswith("int"):
                parts = [rng.integers(-1000, 1000, 777).astype(dtype) for _ in range(3)]
            else:
                parts = [_to_wire(_special(777, r) * 0.37, dtype) for r in range(3)]
            code = _native.DTYPES[dtype]
            a, b = (_native.reduce_kernel(code, _native.OPS[op], parts, s) for s in SIMD)
            assert a == b, (dtype, op)


@pytest.mark.parametrize("simd", SIMD)
def test_ordinary_values_are_numpys(simd):
    rng = np.random.default_rng(9)
    for dtype in ("float32", "float64", "int32", "int64"):
        parts = [(rng.standard_normal(515) * 100).astype(dtype) for _ in range(3)]
        for op, fold in (("min", np.minimum), ("max", np.maximum)):
            raw = _native.reduce_kernel(_native.DTYPES[dtype], _native.OPS[op], parts, simd)
            want = fold(fold(parts[0], parts[1]), parts[2])
            np.testing.assert_array_equal(np.frombuffer(raw, dtype), want)


@pytest.mark.parametrize("simd", SIMD)
def test_float32_sum_every_length_and_alignment_is_numpys(simd):
    # float32 sum has a loop of its own on AVX2 (32 floats a trip, then 8, then single
    # ones): every length through each of those edges, contributions at any 4-byte
    # boundary (as GRO segments are), each element (a + b) + c in float32 as numpy's.
    rng = np.random.default_rng(11)
    code = _native.DTYPES["float32"]
    for n in list(range(0, 72)) + [255, 256, 257, 358, 2234]:
        for shift in (0, 1, 3):  # in 4-byte steps off a 64-byte boundary
            parts = []
            for _ in range(3):
                raw = np.zeros(4 * (n + 8), np.uint8)
                v = raw[4 * shift:4 * (shift + n)].view(np.float32)
                v[:] = (rng.standard_normal(n) * 1e3).astype(np.float32)
                parts.append(v)
            got = np.frombuffer(_native.reduce_kernel(code, _native.OPS["sum"], parts, simd), np.float32)
            want = (parts[0] + parts[1]) + parts[2]
            assert got.tobytes() == want.tobytes(), (n, shift)
