"""A rank's connection to one aggregator job: admission over the control port, then
the native engine that streams buffers through the aggregator's slots.

This is the small, typed surface that the communicator, tests and benchmarks use;
the user-facing API lives in netreduce/__init__.py."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from netreduce import _native, config
from netreduce.control.client import ControlClient, format_address
from netreduce.errors import AdmissionError, ControlPlaneError, DataPlaneError

_NUMPY_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
    np.dtype(np.float16): "float16",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
}
OPS = ("sum", "min", "max")


def dtype_name(array: np.ndarray, dtype: Optional[str] = None) -> str:
    """The wire dtype of ``array``: its numpy dtype, or ``dtype`` ('bfloat16' for a
    16-bit integer buffer holding bfloat16 bits)."""
    if dtype == "bfloat16":
        if array.dtype.itemsize != 2 or array.dtype.kind not in "iu":
            raise ValueError(f"bfloat16 data must be passed as a 16-bit integer buffer, got {array.dtype}")
        return "bfloat16"
    if dtype is not None and dtype != _NUMPY_DTYPES.get(array.dtype):
        raise ValueError(f"dtype {dtype!r} does not match the array's {array.dtype}")
    try:
        return _NUMPY_DTYPES[array.dtype]
    except KeyError:
        raise ValueError(
            f"unsupported dtype {array.dtype}; netreduce reduces float32, float64, float16, "
            "bfloat16, int32 and int64") from None


def _check_array(array: Any, what: str) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{what} must be a numpy array, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (use np.ascontiguousarray)")
    return array


def _translate(exc: Exception, where: str) -> Exception:
    if isinstance(exc, ValueError):
        return exc
    return DataPlaneError(f"{where}: {exc}")


class Request:
    """An all-reduce in flight on the engine thread."""

    def __init__(self, native_req: Any, result: np.ndarray, where: str) -> None:
        self._req = native_req
        self._result = result
        self._where = where

    def done(self) -> bool:
        return bool(self._req.done())

    def wait(self) -> np.ndarray:
        try:
            self._req.wait()
        except _native.EngineError as exc:
            raise _translate(exc, self._where) from None
        return self._result


class Connection:
    """Rank ``rank`` of ``size`` in job ``job`` on the aggregator at ``address``."""

    def __init__(self, address: Tuple[str, int], job: str, rank: int, size: int, *,
                 timeout: Optional[float] = None, retransmit_ms: Optional[float] = None,
                 drop_rate: Optional[float] = None, window: Optional[int] = None,
                 seed: int = 0) -> None:
        # Unset arguments take the NETREDUCE_* knobs (declared in netreduce.config).
        timeout = config.get("NETREDUCE_TIMEOUT") if timeout is None else timeout
        retransmit_ms = config.get("NETREDUCE_RETRANSMIT_MS") if retransmit_ms is None else retransmit_ms
        drop_rate = config.get("NETREDUCE_DROP_RATE") if drop_rate is None else drop_rate
        window = config.get("NETREDUCE_WINDOW") if window is None else window
        self.address = (address[0], int(address[1]))
        self.job, self.rank, self.size = job, rank, size
        self._control = ControlClient(self.address, timeout=timeout)
        try:
            grant = self._control.call("register", job=job, rank=rank, size=size)
        except ControlPlaneError as exc:
            self._control.close()
            raise AdmissionError(str(exc)) from None
        self.job_index = int(grant["job_index"])
        self.key = int(grant["key"])
        self.slots = int(grant["slots"])
        self.payload_bytes = int(grant["payload_bytes"])
        self.data_port = int(grant["data_port"])
        self.threads = int(grant["threads"])
        try:
            self._engine = _native.Engine(
                self.address[0], self.data_port, self.threads, job, self.job_index, rank, size,
                self.key, self.slots, self.payload_bytes, window=window,
                retransmit_ms=retransmit_ms, timeout_s=timeout, drop_rate=drop_rate, seed=seed,
                group=str(grant.get("group", "")), group_port=int(grant.get("group_port", 0)))
        except Exception as exc:
            self._control.close()
            raise _translate(exc, self._where()) from None

    def _where(self) -> str:
        return (f"aggregator {format_address(self.address)}, job '{self.job}', "
                f"rank {self.rank}/{self.size}")

    def _live(self) -> Any:
        """The native engine, or DataPlaneError once close() released it."""
        engine = getattr(self, "_engine", None)
        if engine is None:
            raise DataPlaneError(f"{self._where()}: this connection was closed; "
                                 "connect() again to reduce more")
        return engine

    def allreduce_async(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                        dtype: Optional[str] = None) -> Request:
        """Start reducing ``src`` across the job's ranks into ``dst`` (``src`` itself
        when None). Both arrays must stay untouched until the request is done."""
        src = _check_array(src, "source array")
        name = dtype_name(src, dtype)
        if dst is None:
            dst = src
        else:
            dst = _check_array(dst, "destination array")
            if dst.dtype != src.dtype or dst.nbytes != src.nbytes:
                raise ValueError(f"destination ({dst.dtype}, {dst.nbytes} B) does not match "
                                 f"source ({src.dtype}, {src.nbytes} B)")
        if op not in OPS:
            raise ValueError(f"unsupported op {op!r}; the aggregator does {', '.join(OPS)}")
        if not dst.flags.writeable:
            raise ValueError("destination array is read-only")
        engine = self._live()
        try:
            req = engine.submit(src, dst, _native.DTYPES[name], _native.OPS[op])
        except _native.EngineError as exc:
            raise _translate(exc, self._where()) from None
        return Request(req, dst, self._where())

    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None) -> np.ndarray:
        """Reduce ``src`` across ranks; the result lands in ``dst`` (or in place)."""
        return self.allreduce_async(src, dst, op, dtype).wait()

    def abort(self, reason: str) -> None:
        """Fail the pending and all later operations with DataPlaneError(reason)."""
        self._live().abort(reason)

    def stats(self) -> Dict[str, int]:
        return dict(self._live().stats())

    def counters(self) -> Dict[str, Any]:
        """The aggregator's counters (global and per job)."""
        self._live()
        return self._control.call("counters")

    def close(self) -> None:
        """Release the engine and this rank's place in the job; closing twice is
        harmless."""
        engine, self._engine = getattr(self, "_engine", None), None
        if engine is None:
            return
        del engine
        try:
            self._control.call("release", timeout=2.0)
        except ControlPlaneError:
            pass
        self._control.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(address: Tuple[str, int], job: str, rank: int, size: int, **kw: Any) -> Connection:
    """Admit (job, rank, size) at the aggregator and open the data plane."""
    return Connection(address, job, rank, size, **kw)
