"""The interface every algorithm implements — what netreduce.worker.communicator
calls, and what a rank's data-plane connection (netreduce/worker/dataplane.py)
offers too — and the checks of one reduction's arguments that every implementation
makes before anything is sent (InvalidArgumentError, a ValueError: the data plane's
contract)."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from netreduce.errors import InvalidArgumentError
from netreduce.ops import NATIVE_DTYPES, check_array, dtype_name

try:  # typing.Protocol is 3.8+; kept structural so that Connection itself fits
    from typing import Protocol
except ImportError:  # pragma: no cover
    Protocol = object  # type: ignore


class Algorithm(Protocol):
    name: str
    # Whether ``scale`` may be other than 1.0: the engine multiplies each float32 or
    # float64 sum by it as it copies the result into place (flat.py, the one that
    # does). The others refuse it (``unscaled``) and their callers scale afterwards
    # (netreduce/worker/group_message.py: engine_scale asks for 1.0 of them).
    scales_results: bool

    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None, scale: float = 1.0) -> np.ndarray:
        """Reduce ``src`` across every rank into ``dst`` (``src`` itself when None);
        every rank ends with the same bytes, times ``scale`` (see ``scales_results``).
        Releases the GIL while it waits."""

    def allreduce_async(self, src: np.ndarray, dst: Optional[np.ndarray] = None,
                        op: str = "sum", dtype: Optional[str] = None,
                        scale: float = 1.0) -> Any:
        """allreduce() started and returned at once, run in the order submitted; the
        request's wait() returns ``dst`` or raises what allreduce() would (agreed
        groups in flight, netreduce/worker/pipeline.py)."""

    def abort(self, reason: str) -> None:
        """Fail the running and every later call (any thread)."""

    def stats(self) -> Dict[str, Any]:
        """Counters of the data plane(s) underneath."""

    def close(self) -> None:
        """Release everything; closing twice is harmless."""


def connect_settings(knobs: Mapping[str, Any]) -> Dict[str, Any]:
    """connect()'s keyword arguments that the knobs give (netreduce/worker/dataplane.py):
    every data-plane connection of a rank -- the job's first, a process set's, another
    aggregator's, a hierarchical shard's, a failover candidate's -- is opened with
    these, from the snapshot the rank took at init()."""
    return dict(timeout=float(knobs["NETREDUCE_TIMEOUT"]),
                retransmit_ms=float(knobs["NETREDUCE_RETRANSMIT_MS"]),
                drop_rate=float(knobs["NETREDUCE_DROP_RATE"]),
                window=int(knobs["NETREDUCE_WINDOW"]))


OPS = ("sum", "min", "max", "product")


def unscaled(algorithm: str, scale: float) -> InvalidArgumentError:
    """The error of an algorithm whose ``scales_results`` is False, asked for ``scale``
    other than 1.0 (raised before anything is sent)."""
    return InvalidArgumentError(
        f"the {algorithm} algorithm does not scale results (scale={scale!r}): only one "
        "whose scales_results is True (flat) takes a scale other than 1.0; multiply the "
        "result instead")


# The dtypes the engine carries as they are, by numpy dtype (ops.dtype_name's names):
# what check_reduction's one look accepts.
_CARRIED = {np.dtype(name): name for name in NATIVE_DTYPES if name != "bfloat16"}
_OPS = frozenset(OPS)


def check_reduction(src: Any, dst: Any, op: str, dtype: Optional[str],
                    reducer: str) -> Tuple[np.ndarray, np.ndarray, str]:
    """The arguments of one reduction, checked before anything is sent: returns
    (src, dst, dtype name) with ``dst`` = ``src`` for an in-place reduction.
    ``reducer`` names who reduces in the op error ("the aggregator", "netreduce").

    Plain C-contiguous, writeable numpy arrays of a carried dtype, alike, pass with one
    look at each (what the executor hands over per data message and round: ~2.6 -> ~1 us
    at load 20, issue 33's per-call path); anything else, and every error, goes through
    the full checks."""
    if dtype is None and type(src) is np.ndarray and op in _OPS:
        name = _CARRIED.get(src.dtype)
        flags = src.flags
        if name is not None and flags.c_contiguous:
            if dst is None:
                if flags.writeable:
                    return src, src, name
            elif type(dst) is np.ndarray and dst.dtype == src.dtype and \
                    dst.nbytes == src.nbytes:
                flags = dst.flags
                if flags.c_contiguous and flags.writeable:
                    return src, dst, name
    return _check_in_full(src, dst, op, dtype, reducer)


def _check_in_full(src: Any, dst: Any, op: str, dtype: Optional[str],
                   reducer: str) -> Tuple[np.ndarray, np.ndarray, str]:
    """check_reduction without its one look: every conversion and every error."""
    src = check_array(src, "source array")
    name = dtype_name(src, dtype, native=True)
    if dst is None:
        dst = src
    else:
        dst = check_array(dst, "destination array")
        if dst.dtype != src.dtype or dst.nbytes != src.nbytes:
            raise InvalidArgumentError(f"destination ({dst.dtype}, {dst.nbytes} B) does not "
                                       f"match source ({src.dtype}, {src.nbytes} B)")
    if op not in OPS:
        raise InvalidArgumentError(f"unsupported op {op!r}; {reducer} does {', '.join(OPS)}")
    if not dst.flags.writeable:
        raise InvalidArgumentError("destination array is read-only")
    return src, dst, name
