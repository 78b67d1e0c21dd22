"""NDArrays as numpy arrays over the same memory, for the core to read and write.

``NDArray.asnumpy()`` copies (MXNDArraySyncCopyToCPU), and numpy's ``from_dlpack``
of MXNet's DLPack capsule gives a read-only array. So a CPU NDArray is handed over
through its data pointer: wait for the engine (MXNDArrayWaitToRead, or
MXNDArrayWaitToWrite when the core will write the result into it), take
MXNDArrayGetData — which, in builds with MKLDNN, first reorders an array held in an
MKLDNN layout back to the default row-major layout — and wrap that address in a numpy
array of the same dtype and shape. Dense NDArrays are always contiguous, so there is
no stride to check.

The view is valid while the NDArray lives and no MXNet operation writes it; the
callers hold the NDArray and wait for the core before they return, and MXNet only
runs operations this thread pushed before the wait. An array on a GPU is staged
through a CPU copy (the data plane reads host memory) and copied back after.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call
from netreduce.errors import InvalidTypeError

# dtypes the core reduces (netreduce.ops.WIRE_DTYPE); MXNet's bool exists only for
# its numpy-compatible arrays and is refused with the rest.
REDUCIBLE = ("float16", "float32", "float64", "uint8", "int8", "int32", "int64")


class HostBuffer:
    """One NDArray and the numpy array over its host memory (``array``)."""

    __slots__ = ("nd", "host", "array")

    def __init__(self, nd, what: str, name: Optional[str], write: bool) -> None:
        if not isinstance(nd, mx.nd.NDArray):
            raise InvalidTypeError(f"{what}: expected an mxnet NDArray, got {type(nd).__name__}")
        label = f"tensor {name!r}" if name is not None else "tensor"
        if nd.stype != "default":
            raise InvalidTypeError(f"{what}: {label} has storage type {nd.stype!r}; netreduce "
                            "reduces dense NDArrays only (sparse gradients: use "
                            "grad_stype='default')")
        dtype = np.dtype(nd.dtype).name
        if dtype not in REDUCIBLE:
            raise InvalidTypeError(f"{what}: {label} has unsupported dtype {dtype}; supported: "
                            + ", ".join(REDUCIBLE))
        self.nd = nd
        # GPU arrays: a CPU copy is what the data plane reads and writes.
        self.host = nd if nd.context.device_type == "cpu" else nd.copyto(mx.cpu())
        self.array = host_view(self.host, write)

    def write_back(self) -> None:
        """After an in-place operation: the result into the NDArray (a no-op on CPU)."""
        if self.host is not self.nd:
            self.host.copyto(self.nd)


def host_view(nd, write: bool) -> np.ndarray:
    """A numpy array over ``nd``'s memory, after the engine has finished the pending
    writes to it (and, with ``write``, the pending reads too)."""
    handle = nd.handle
    check_call(_LIB.MXNDArrayWaitToWrite(handle) if write else _LIB.MXNDArrayWaitToRead(handle))
    dtype = np.dtype(nd.dtype)
    shape = tuple(int(d) for d in nd.shape)
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, dtype=dtype)
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(handle, ctypes.byref(ptr)))
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr.value)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
