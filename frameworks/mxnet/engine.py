"""Finishing a netreduce reduction inside MXNet's dependency engine.

``KVStore.pushpull`` submits its tensors to the core and returns; the wait for the
result is an operation pushed into MXNet's engine (MXEnginePushSyncND) that *writes*
the reduced NDArrays. MXNet then orders every later operation on those arrays (the
optimizer update, the next backward pass) after the reduction, exactly as for its own
kvstores, while the Python thread goes on to submit the next gradients — so the
Trainer's one-call-per-parameter loop is negotiated and fused as one burst instead of
one round trip per parameter.

The operation is marked FnProperty::kCPUPrioritized, which the threaded engine runs
on its own CPU worker pool: a reduction waiting for the network never holds the
worker that computes the rest of the backward pass. It cannot raise into MXNet (an
engine callback from ctypes has no way to hand MXNet a C++ exception), so a failure
is kept and raised by the store's next call (see kvstore.py).
"""
from __future__ import annotations

import atexit
import ctypes
import itertools
import threading
from typing import Callable, Dict, Sequence

import mxnet as mx
from mxnet.base import _LIB, check_call, c_str

_SyncFunc = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class _Context(ctypes.Structure):  # mxnet::Context: {DeviceType dev_type; int32 dev_id}
    _fields_ = [("dev_type", ctypes.c_int32), ("dev_id", ctypes.c_int32)]


_CPU = _Context(1, 0)                 # Context::kCPU
_CPU_PRIORITIZED = ctypes.c_int(3)    # FnProperty::kCPUPrioritized (include/mxnet/engine.h)
_jobs: Dict[int, Callable[[], None]] = {}
_tokens = itertools.count(1)
_lock = threading.Lock()
_drain_registered = False


def _run(rctx, token) -> None:  # an engine worker thread; ctypes takes the GIL
    with _lock:
        job = _jobs.pop(int(token or 0), None)
    if job is not None:
        job()  # the job catches its own errors: nothing may escape into the engine


_RUN = _SyncFunc(_run)  # kept alive for the process: the engine calls it later

_push = _LIB.MXEnginePushSyncND
_push.argtypes = [_SyncFunc, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                  ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]


def push(job: Callable[[], None], writes: Sequence[mx.nd.NDArray], priority: int = 0,
         name: str = "netreduce_pushpull") -> None:
    """Run ``job`` (it must not raise) in the engine once every pending operation on
    ``writes`` is done; later operations on them wait for it."""
    global _drain_registered
    if not _drain_registered:
        # Registered after netreduce.init()'s own atexit hook, so it runs first: the
        # engine's pending waits finish while the communicator is still up.
        atexit.register(mx.nd.waitall)
        _drain_registered = True
    token = next(_tokens)
    with _lock:
        _jobs[token] = job
    handles = (ctypes.c_void_p * len(writes))(*[nd.handle.value for nd in writes])
    try:
        check_call(_push(_RUN, ctypes.c_void_p(token), None, ctypes.byref(_CPU), None, 0,
                         handles, len(writes), ctypes.byref(_CPU_PRIORITIZED), int(priority),
                         c_str(name)))
    except BaseException:
        with _lock:
            _jobs.pop(token, None)
        raise
