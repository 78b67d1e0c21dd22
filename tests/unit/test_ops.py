"""Reduce ops, dtypes and Horovod's scaling arithmetic."""
import numpy as np
import pytest

import netreduce as nr
from netreduce import ops
from tests.peers import require_horovod_torch


def test_public_op_names():
    assert nr.Average is nr.ReduceOp.Average and nr.Sum is nr.ReduceOp.Sum
    assert nr.Min is nr.ReduceOp.Min and nr.Max is nr.ReduceOp.Max
    assert ops.as_op("sum") is nr.Sum and ops.as_op("Average") is nr.Average
    assert nr.Average.wire == "sum" and nr.Max.wire == "max"
    assert ops.as_op("product") is nr.Product and nr.Product.wire == "product"


@pytest.mark.parametrize("op", [nr.ReduceOp.Adasum, "adasum", 2])
def test_unsupported_ops_raise_not_implemented(op):
    with pytest.raises(NotImplementedError, match="not supported"):
        ops.as_op(op)


def test_unknown_op():
    with pytest.raises(ValueError, match="unknown reduce op"):
        ops.as_op("median")
    with pytest.raises(ValueError, match="Horovod's op values are Average=0"):
        ops.as_op(6)
    with pytest.raises(ValueError, match="unknown reduce op"):
        ops.as_op(-1)
    with pytest.raises(TypeError):
        ops.as_op(1.0)
    with pytest.raises(TypeError):
        ops.as_op(True)  # a bool is an int to Python, but never a reduce op


def test_horovod_integer_op_values():
    """Code written for Horovod may pass its integer constants (op=0 is Average)."""
    assert ops.as_op(0) is nr.Average and ops.as_op(1) is nr.Sum
    assert ops.as_op(3) is nr.Min and ops.as_op(np.int64(4)) is nr.Max
    assert ops.as_op(5) is nr.Product  # a slot op of the aggregator
    with pytest.raises(NotImplementedError, match="Adasum is not supported"):
        ops.as_op(2)  # Adasum: named, but not an element-wise slot op


def test_integer_op_values_match_installed_horovod():
    hvd = require_horovod_torch()  # fails under CI when Horovod is missing
    for name in ("Average", "Sum", "Adasum", "Min", "Max", "Product"):
        assert ops.HOROVOD_OP_VALUES[getattr(hvd, name)] is getattr(nr.ReduceOp, name), name


def test_dtype_names():
    assert ops.dtype_name(np.zeros(2, np.float32)) == "float32"
    assert ops.dtype_name(np.zeros(2, np.uint16), "bfloat16") == "bfloat16"
    assert ops.dtype_name(np.zeros(2, np.int8)) == "int8"
    with pytest.raises(TypeError, match="cannot all-reduce dtype complex64"):
        ops.dtype_name(np.zeros(2, np.complex64))
    with pytest.raises(TypeError, match="2-byte elements"):
        ops.dtype_name(np.zeros(2, np.float32), "bfloat16")


def test_non_contiguous_is_a_value_error():
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.check_array(np.zeros((4, 4), np.float32)[:, 1])
    with pytest.raises(TypeError, match="numpy.ndarray"):
        ops.check_array([1, 2])


def test_integer_scaling_goes_through_float64_and_truncates():
    dst = np.empty(3, np.int32)
    ops.scale_into(dst, np.array([3, -3, 7], np.int32), 0.5, "int32")
    assert dst.tolist() == [1, -1, 3]


def test_float16_scaling_in_float32():
    src = np.array([60000.0], np.float16)  # *2 overflows float16 but the /4 brings it back
    dst = np.empty(1, np.float16)
    ops.scale_into(dst, src, 0.25, "float16")
    assert dst[0] == np.float16(15000.0)


def test_bfloat16_round_trip_and_scale():
    values = np.array([1.0, -2.5, 3.0e38, 0.0], np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    out = np.empty_like(bits)
    ops.scale_into(out, bits, 0.5, "bfloat16")
    back = (out.astype(np.uint32) << 16).view(np.float32)
    assert back.tolist()[:2] == [0.5, -1.25] and back[3] == 0.0
    assert abs(back[2] - 1.5e38) / 1.5e38 < 1e-2


def test_small_ints_ride_wider_wire_types():
    assert ops.WIRE_DTYPE["int8"] == "int32" and ops.WIRE_DTYPE["uint32"] == "int64"
    wire = np.empty(2, np.int32)
    ops.scale_into(wire, np.array([-1, 100], np.int8), 1.0, "int8", "int32")
    assert wire.tolist() == [-1, 100]


def test_the_numpy_free_sizes_are_numpys():
    # netreduce/dtypes.py states each wire dtype's size without numpy (for the daemon's
    # signatures); the worker's numpy storage must agree, every dtype.
    from netreduce import dtypes
    assert set(dtypes.WIRE_ITEMSIZE) == set(dtypes.WIRE_DTYPE.values())
    for wire, size in dtypes.WIRE_ITEMSIZE.items():
        assert ops.STORAGE[wire].itemsize == size, wire


@pytest.mark.parametrize("call, builtin", [
    (lambda: ops.as_op("median"), ValueError),
    (lambda: ops.as_op(3.5), TypeError),
    (lambda: ops.check_array([1, 2]), TypeError),
    (lambda: ops.check_array(np.ones((4, 4), np.float32)[:, 1]), ValueError),
    (lambda: ops.dtype_name(np.ones(2, np.complex64)), TypeError),
])
def test_bad_arguments_are_netreduce_errors_and_horovods_builtin_types(call, builtin):
    """Bad input is a NetReduceError (what `except NetReduceError` in a training loop
    catches) and the built-in type Horovod raises there (what Horovod code catches)."""
    with pytest.raises(nr.NetReduceError) as info:
        call()
    assert isinstance(info.value, builtin), type(info.value).__mro__


def test_one_array_check_serves_the_api_and_the_data_plane():
    """ops.check_array / dtype_name are the API's checks and, with native=True, the data
    plane's (algorithms/base.py): one error type, a TypeError for Horovod's callers and a
    ValueError for the data plane's."""
    from netreduce.algorithms.base import check_reduction
    from netreduce.errors import InvalidArrayError
    assert ops.dtype_name(np.ones(2, np.int8)) == "int8"  # the API widens it on the wire
    assert ops.dtype_name(np.ones(2, np.uint16), "bfloat16", native=True) == "bfloat16"
    for call in (lambda: ops.dtype_name(np.ones(2, np.int8), native=True),
                 lambda: ops.dtype_name(np.ones(2, np.float32), "int32", native=True),
                 lambda: check_reduction(np.ones(2, np.complex64), None, "sum", None, "x"),
                 lambda: check_reduction([1.0], None, "sum", None, "x")):
        with pytest.raises(InvalidArrayError) as info:
            call()
        assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
