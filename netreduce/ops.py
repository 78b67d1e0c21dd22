"""Reduction ops, dtypes and the element-wise work around the wire all-reduce.

The data plane sums, mins, maxes and multiplies (docs/design.md: "Average is a post-scale
on the worker"). Everything else a user asks for is done here, on the worker, in Horovod's
way: prescale before the sum, postscale (and 1/size for Average) after it; integers
are scaled in float64 and cast back, float16 and bfloat16 in float32.
"""
from __future__ import annotations

import enum
import numbers
from typing import Any, Optional

import numpy as np
from netreduce.dtypes import NATIVE_DTYPES, WIRE_DTYPE  # noqa: F401  (re-exported)
from netreduce.errors import (InvalidArgumentError, InvalidArrayError, InvalidTypeError,
                              UnsupportedError)


class ReduceOp(enum.Enum):
    """What all-reduce computes across ranks (Horovod's names)."""

    Average = "average"
    Sum = "sum"
    Min = "min"
    Max = "max"
    Product = "product"
    Adasum = "adasum"

    @property
    def wire(self) -> str:
        """The data-plane op: Average is a Sum followed by a division on the worker.
        Adasum (a pairwise, norm-dependent combination, not an element-wise slot op)
        is refused."""
        if self is ReduceOp.Adasum:
            raise UnsupportedError(
                f"ReduceOp.{self.name} is not supported by netreduce: the aggregator "
                "implements sum, min, max and product (Average = sum / size)")
        return "sum" if self is ReduceOp.Average else self.value


Average, Sum, Min, Max = ReduceOp.Average, ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max
Product, Adasum = ReduceOp.Product, ReduceOp.Adasum


# Horovod's integer op values (horovod.torch.mpi_ops / horovod.common.basics 0.28:
# horovod_reduce_op_average() == 0, ...), for code that passes hvd.Sum from a
# horovod import or a literal.
HOROVOD_OP_VALUES = {0: ReduceOp.Average, 1: ReduceOp.Sum, 2: ReduceOp.Adasum,
                     3: ReduceOp.Min, 4: ReduceOp.Max, 5: ReduceOp.Product}


def as_op(op) -> ReduceOp:
    """ReduceOp from a ReduceOp, its name ('sum', 'Average', ...) or Horovod's
    integer value (Average=0, Sum=1, Adasum=2, Min=3, Max=4, Product=5)."""
    if op.__class__ is ReduceOp and op is not ReduceOp.Adasum:
        return op          # the common case, once per call: skip the checks below
    if isinstance(op, ReduceOp):
        result = op
    elif isinstance(op, numbers.Integral) and not isinstance(op, bool):
        try:
            result = HOROVOD_OP_VALUES[int(op)]
        except KeyError:
            raise InvalidArgumentError(f"unknown reduce op {op!r}: Horovod's op values are "
                             + ", ".join(f"{o.name}={v}" for v, o in HOROVOD_OP_VALUES.items())
                             ) from None
    elif isinstance(op, str):
        try:
            result = ReduceOp(op.lower())
        except ValueError:
            raise InvalidArgumentError(f"unknown reduce op {op!r}; use one of "
                             f"{[o.name for o in ReduceOp]}") from None
    else:
        raise InvalidTypeError(f"op must be a netreduce.ReduceOp, its name or Horovod's integer "
                        f"value, got {type(op).__name__}")
    result.wire  # noqa: B018  raises UnsupportedError (a NotImplementedError) for Adasum
    return result


# WIRE_DTYPE (dtype name -> the dtype the data plane carries it in) and NATIVE_DTYPES
# live in netreduce/dtypes.py, numpy-free for the daemon; imported above and re-exported.
# numpy storage of each wire dtype (bfloat16 travels as its uint16 bit pattern)
STORAGE = {name: np.dtype("uint16" if name == "bfloat16" else name) for name in WIRE_DTYPE}


_NAMES = {np.dtype(name): name for name in WIRE_DTYPE if name != "bfloat16"}


def dtype_name(array: np.ndarray, dtype: Optional[str] = None, *, native: bool = False) -> str:
    """netreduce's name for ``array``'s dtype (InvalidArrayError if it has none).
    ``dtype`` names what the bits hold where numpy has no type for it: 'bfloat16' on a
    16-bit integer array (what a framework adapter hands over). ``native``: only the
    dtypes the data plane carries as they are (NATIVE_DTYPES, no widening), with
    ``dtype`` equal to the array's own but for bfloat16 -- the data plane's contract
    (netreduce/algorithms/base.py, check_reduction)."""
    supported = NATIVE_DTYPES if native else tuple(WIRE_DTYPE)
    if dtype == "bfloat16" and native and (array.dtype.itemsize != 2
                                          or array.dtype.kind not in "iu"):
        raise InvalidArrayError(f"bfloat16 data must be passed as a 16-bit integer buffer, "
                                f"got {array.dtype}")
    if dtype is not None and (dtype != "bfloat16" or not native):
        if dtype not in supported:
            raise InvalidArrayError(f"unsupported dtype {dtype!r}; supported: {sorted(supported)}")
        if native and dtype != array.dtype.name:
            raise InvalidArrayError(f"dtype {dtype!r} does not match the array's {array.dtype}")
        if STORAGE[dtype].itemsize != array.dtype.itemsize:
            raise InvalidArrayError(f"dtype {dtype!r} needs {STORAGE[dtype].itemsize}-byte "
                                    f"elements, the array has {array.dtype}")
    if dtype is not None:
        return dtype
    # numpy's dtype.name is Python code (~1-2 us): the names it gives the dtypes
    # netreduce carries, looked up per dtype instead (per message on the executor).
    name = _NAMES.get(array.dtype) or array.dtype.name
    if name not in supported:
        raise InvalidArrayError(f"netreduce cannot all-reduce dtype {name}; supported: "
                                f"{sorted(supported)}")
    return name


def check_array(array: Any, what: str = "array") -> np.ndarray:
    """``array`` if netreduce can reduce it in place: a C-contiguous numpy array
    (InvalidArrayError, InvalidArgumentError otherwise, naming ``what``)."""
    if not isinstance(array, np.ndarray):
        raise InvalidArrayError(f"{what}: expected a numpy.ndarray, got {type(array).__name__} "
                                "(framework tensors go through netreduce.torch etc.)")
    if not array.flags.c_contiguous:
        raise InvalidArgumentError(f"{what}: netreduce needs C-contiguous arrays (the data plane "
                                   f"reads one flat buffer); got strides {array.strides} for "
                                   f"shape {array.shape}: pass numpy.ascontiguousarray(x)")
    return array


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values: np.ndarray, out: np.ndarray) -> None:
    """Round to nearest even, the way the aggregator rounds (NaN stays NaN)."""
    b = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((b + np.uint32(0x7FFF) + ((b >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = 0x7FC0
    out[...] = rounded.reshape(out.shape)


def scale_into(dst: np.ndarray, src: np.ndarray, factor: float, dtype: str,
               wire: Optional[str] = None) -> None:
    """dst = src * factor with Horovod's arithmetic. ``dtype`` is the tensor's dtype
    name, ``wire`` the dtype of ``dst`` when it differs (src→wire on the way in,
    wire→dtype on the way out); both arrays are flat or of equal shape."""
    if factor == 1.0:
        np.copyto(dst, src, casting="unsafe")
        return
    kinds = {dtype, wire or dtype}
    if "bfloat16" in kinds:
        _f32_to_bf16(_bf16_to_f32(src) * np.float32(factor), dst)
    elif kinds & {"float16"}:
        np.copyto(dst, src.astype(np.float32) * np.float32(factor), casting="unsafe")
    elif np.dtype(STORAGE[dtype]).kind in "iu":
        # float64 then truncate toward zero, as Horovod's static_cast<T>(x * factor)
        np.copyto(dst, src.astype(np.float64) * factor, casting="unsafe")
    else:
        np.multiply(src, factor, out=dst, casting="unsafe")
