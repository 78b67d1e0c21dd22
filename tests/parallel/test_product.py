"""ReduceOp.Product in the aggregator's slots: a real netreduce-switch daemon, 2 and 3
rank processes, every wire dtype, messages of several packets, checked element by
element against numpy (integers wrap modulo 2^bits as numpy's do; 16-bit floats are
multiplied in float32 and rounded once)."""
from __future__ import annotations

import uuid

import numpy as np
import pytest

from netreduce.worker import dataplane
from tests.parallel.ranks import run_ranks

COUNT = 40_003  # several jumbo packets for every dtype, not a multiple of any
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]


def _data(dtype, rank, count):
    rng = np.random.default_rng(7000 + rank)
    if dtype in ("int32", "int64"):
        return rng.integers(-100, 100, count).astype(dtype)
    # magnitudes in [0.5, 2): a product of 3 stays well inside float16's range
    values = rng.uniform(0.5, 2.0, count) * rng.choice([-1.0, 1.0], count)
    if dtype == "bfloat16":  # bfloat16 bits: float32's top half
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(dtype)


def _as_float(a, dtype):
    return (a.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else a


def _product_ranks(rank, size, address, job):
    with dataplane.connect(address, job, rank, size, timeout=20.0) as conn:
        for dtype in DTYPES:
            mine = _data(dtype, rank, COUNT)
            conn.allreduce(mine, op="product", dtype="bfloat16" if dtype == "bfloat16" else None)
            every = [_data(dtype, r, COUNT) for r in range(size)]
            got = _as_float(mine, dtype)
            if dtype.startswith("int"):
                np.testing.assert_array_equal(got, np.prod(every, axis=0, dtype=dtype),
                                              err_msg=dtype)
                continue
            ref = np.prod([_as_float(a, dtype).astype(np.float64) for a in every], axis=0)
            rtol = {"float32": 1e-6, "float64": 1e-14, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
            np.testing.assert_allclose(got.astype(np.float64), ref, rtol=rtol, err_msg=dtype)
        # Integer products wrap as numpy's (and Horovod's int32 tensors) do.
        big = np.full(5, 70_000 + rank, dtype=np.int32)
        conn.allreduce(big, op="product")
        want = np.prod([np.full(5, 70_000 + r, dtype=np.int32) for r in range(size)], axis=0,
                       dtype=np.int32)
        np.testing.assert_array_equal(big, want)


@pytest.mark.parametrize("size", [2, 3])
def test_product_every_dtype_against_numpy(switch, size):
    run_ranks(_product_ranks, size, switch.address, "product-" + uuid.uuid4().hex[:8])


def test_product_is_a_slot_op_of_the_wire():
    from netreduce import _native
    assert _native.OPS["product"] == 3  # the last free value of RETH.VA's 2-bit op field
    from netreduce.algorithms import base
    assert base.OPS == ("sum", "min", "max", "product")
