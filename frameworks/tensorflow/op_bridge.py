"""The graph ops' Python half: one thread that takes the asynchronous kernels'
requests (kernels/collective_ops.cc) and submits them to the netreduce core.

Nothing here waits for a collective. The bridge thread blocks only in
``nrtf_next()`` (native, GIL released) for the next request; it reads the request's
spec and buffers, submits through buffers.py and returns to the queue. The core
thread that completes the handles runs ``_finish``: it writes the results that
were not produced in place into TensorFlow outputs it allocates then, and calls
``nrtf_done``, TensorFlow's done callback. Submission order is whatever order
TensorFlow ran the kernels in on this rank; the core's negotiation pairs tensors
by name whatever the order on each rank, so the order cannot deadlock.
"""
from __future__ import annotations

import atexit
import ctypes
import json
import logging
import threading
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from . import buffers
from .errors import status_code
from .op_library import Library, load

log = logging.getLogger("netreduce")
# TensorFlow's DataType enum -> numpy dtype, for the types the ops accept.
_DTYPES: Dict[int, np.dtype] = {
    int(d.as_datatype_enum): np.dtype(d.as_numpy_dtype)
    for d in (tf.int8, tf.uint8, tf.int16, tf.uint16, tf.int32, tf.uint32, tf.int64,
              tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.bool)}
IN_PLACE = ("allreduce", "broadcast")
HELP = True  # the kernel preallocated outputs holding the input


def _view(address: int, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """A numpy array over TensorFlow's buffer at ``address`` (no copy)."""
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0 or address == 0:
        return np.empty(shape, dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(address)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


class Bridge:
    def __init__(self, lib: Library) -> None:
        self.lib, self.c = lib, lib.c
        self._specs: Dict[bytes, Dict[str, Any]] = {}
        self._thread = threading.Thread(target=self._loop, name="netreduce-tf-bridge",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.c.nrtf_stop()
        self._thread.join(5.0)

    def _loop(self) -> None:
        while True:
            rid = self.c.nrtf_next(1000)
            if rid < 0:
                return
            if rid:
                try:
                    self._start(rid)
                except Exception:  # a bug here must not stop every later graph op
                    log.exception("netreduce.tensorflow: the op bridge failed on a request")

    def _spec(self, text: bytes) -> Dict[str, Any]:
        spec = self._specs.get(text)
        if spec is None:
            spec = self._specs[text] = json.loads(text)
        return spec

    def _start(self, rid: int) -> None:
        spec_p, desc_p = ctypes.c_char_p(), ctypes.POINTER(ctypes.c_int64)()
        words = ctypes.c_int64()
        if not self.c.nrtf_request(rid, ctypes.byref(spec_p), ctypes.byref(desc_p),
                                   ctypes.byref(words)):
            return
        try:
            spec = self._spec(spec_p.value)
            desc = desc_p[:words.value]
            inputs: List[np.ndarray] = []
            outputs: List[Optional[np.ndarray]] = []
            pos = 1
            for _ in range(desc[0]):
                dtype, rank = _DTYPES[desc[pos]], desc[pos + 1]
                shape = tuple(desc[pos + 2:pos + 2 + rank])
                pos += 2 + rank
                inputs.append(_view(desc[pos], shape, dtype))
                outputs.append(_view(desc[pos + 1], shape, dtype) if desc[pos + 1] else None)
                pos += 2
            kind = spec["k"]
            if kind in IN_PLACE:
                pending = buffers.submit(spec, outputs, inplace=True)
            elif kind == "alltoall":
                pending = buffers.submit(spec, inputs[:1], splits=inputs[1])
            else:
                pending = buffers.submit(spec, inputs)
        except Exception as exc:
            self._done(rid, exc)
            return
        pending.when_done(lambda result, error: self._finish(rid, kind, outputs, result, error))
        if HELP and not self.c.nrtf_queued():
            # Nothing else to submit: if this completes a steady-state step, run its
            # data-plane message here (as a waiting eager caller would) instead of
            # handing it to the core's executor thread. It returns at once otherwise.
            try:
                for handle in pending.handles:
                    handle.run_if_ready()
            except Exception:
                pass  # the step's failure reaches the request through its handle

    def _finish(self, rid: int, kind: str, outputs: List[Optional[np.ndarray]], result: Any,
                error: Optional[BaseException]) -> None:
        try:
            if error is not None:
                raise error
            if kind in IN_PLACE:
                for out, r in zip(outputs, result):
                    if not np.may_share_memory(out, r):
                        np.copyto(out, r, casting="unsafe")  # bool, widened for the trip
            elif kind == "alltoall":
                self._emit(rid, 0, result[0])
                self._emit(rid, 1, result[1])
            else:
                for i, r in enumerate(result):
                    self._emit(rid, i, r)
        except Exception as exc:
            self._done(rid, exc)
            return
        self._done(rid, None)

    def _emit(self, rid: int, index: int, array: np.ndarray) -> None:
        dims = (ctypes.c_int64 * max(1, array.ndim))(*array.shape)
        failed = ctypes.c_int()
        address = self.c.nrtf_allocate(rid, index, array.ndim, dims, ctypes.byref(failed))
        if failed.value:
            raise MemoryError(f"netreduce.tensorflow: TensorFlow could not allocate output "
                              f"{index} of shape {list(array.shape)}")
        if array.size:
            np.copyto(_view(address, array.shape, array.dtype), array)

    def _done(self, rid: int, error: Optional[BaseException]) -> None:
        if error is None:
            self.c.nrtf_done(rid, 0, b"")
        else:
            self.c.nrtf_done(rid, status_code(error), str(error).encode("utf-8", "replace"))


_lock = threading.Lock()
_bridge: Optional[Bridge] = None


def bridge() -> Bridge:
    """The process's bridge, started (and the library loaded, built if needed) once."""
    global _bridge
    with _lock:
        if _bridge is None:
            _bridge = Bridge(load())
            atexit.register(_bridge.stop)  # before netreduce's own shutdown (LIFO)
        return _bridge


def graph_call(kind: str, inputs: Sequence[tf.Tensor], spec: Dict[str, Any]) -> List[tf.Tensor]:
    """Add one netreduce op to the graph being built; returns its outputs."""
    ops = bridge().lib.ops
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    if kind == "alltoall":
        outs = list(ops.netreduce_alltoall(tensor=inputs[0], splits=inputs[1], spec=text))
    else:
        outs = list(getattr(ops, f"netreduce_{kind}")(tensors=list(inputs), spec=text))
    # tf.function's automatic control dependencies would run stateful ops in program
    # order; these may run in any order (the core pairs them by name), so they are
    # marked independent: they still always run, but nothing waits on them but their
    # consumers, and a collective never waits for an unrelated one.
    acd = getattr(tf.compat.v1.get_default_graph(), "experimental_acd_manager", None)
    if acd is not None:
        acd.run_independently(outs[0].op)
    return outs
