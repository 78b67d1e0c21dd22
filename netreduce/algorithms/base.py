"""The interface every algorithm implements — what netreduce.worker.communicator
calls, and what a rank's data-plane connection (netreduce/worker/dataplane.py)
offers too — and the checks of one reduction's arguments that every implementation
makes before anything is sent (InvalidArgumentError, a ValueError: the data plane's
contract)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from netreduce.errors import InvalidArgumentError

try:  # typing.Protocol is 3.8+; kept structural so that Connection itself fits
    from typing import Protocol
except ImportError:  # pragma: no cover
    Protocol = object  # type: ignore


class Algorithm(Protocol):
    name: str

    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None) -> np.ndarray:
        """Reduce ``src`` across every rank into ``dst`` (``src`` itself when None);
        every rank ends with the same bytes. Releases the GIL while it waits."""

    def abort(self, reason: str) -> None:
        """Fail the running and every later call (any thread)."""

    def stats(self) -> Dict[str, Any]:
        """Counters of the data plane(s) underneath."""

    def close(self) -> None:
        """Release everything; closing twice is harmless."""


_NUMPY_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
    np.dtype(np.float16): "float16",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
}
OPS = ("sum", "min", "max", "product")


def dtype_name(array: np.ndarray, dtype: Optional[str] = None) -> str:
    """The wire dtype of ``array``: its numpy dtype, or ``dtype`` ('bfloat16' for a
    16-bit integer buffer holding bfloat16 bits)."""
    if dtype == "bfloat16":
        if array.dtype.itemsize != 2 or array.dtype.kind not in "iu":
            raise InvalidArgumentError(f"bfloat16 data must be passed as a 16-bit integer buffer, got {array.dtype}")
        return "bfloat16"
    if dtype is not None and dtype != _NUMPY_DTYPES.get(array.dtype):
        raise InvalidArgumentError(f"dtype {dtype!r} does not match the array's {array.dtype}")
    try:
        return _NUMPY_DTYPES[array.dtype]
    except KeyError:
        raise InvalidArgumentError(
            f"unsupported dtype {array.dtype}; netreduce reduces float32, float64, float16, "
            "bfloat16, int32 and int64") from None


def check_array(array: Any, what: str) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise InvalidArgumentError(f"{what} must be a numpy array, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise InvalidArgumentError(f"{what} must be C-contiguous (use np.ascontiguousarray)")
    return array


def check_reduction(src: Any, dst: Any, op: str, dtype: Optional[str],
                    reducer: str) -> Tuple[np.ndarray, np.ndarray, str]:
    """The arguments of one reduction, checked before anything is sent: returns
    (src, dst, dtype name) with ``dst`` = ``src`` for an in-place reduction.
    ``reducer`` names who reduces in the op error ("the aggregator", "netreduce")."""
    src = check_array(src, "source array")
    name = dtype_name(src, dtype)
    if dst is None:
        dst = src
    else:
        dst = check_array(dst, "destination array")
        if dst.dtype != src.dtype or dst.nbytes != src.nbytes:
            raise InvalidArgumentError(f"destination ({dst.dtype}, {dst.nbytes} B) does not match "
                             f"source ({src.dtype}, {src.nbytes} B)")
    if op not in OPS:
        raise InvalidArgumentError(f"unsupported op {op!r}; {reducer} does {', '.join(OPS)}")
    if not dst.flags.writeable:
        raise InvalidArgumentError("destination array is read-only")
    return src, dst, name
