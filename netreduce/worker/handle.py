"""One request's objects: the Handle the *_async calls return (completion, errors,
done callbacks, the speculative step a wait may run) and the Tensor records of a
submission that the communicator carries from submit to completion."""
from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional

import numpy as np

from netreduce.errors import OperationTimeoutError, tensor_names
from netreduce.ops import ReduceOp
from netreduce.protocol.signature import Signature
from netreduce.worker import timeline as tl
from netreduce.worker.done_flag import DoneFlag

log = logging.getLogger("netreduce")


class Handle:
    """What the *_async calls return; pass it to netreduce.poll / synchronize."""

    def __init__(self, outputs: List[np.ndarray], grouped: bool) -> None:
        self._outputs, self._grouped = outputs, grouped
        self._remaining = len(outputs)
        self._names: List[str] = []  # of the tensors behind it (Tensor adds itself)
        self._error: Optional[BaseException] = None
        self._event = DoneFlag()  # its lock guards _remaining and _error too
        self._helper: Optional[Callable[["Handle"], None]] = None  # Agreement.help
        self._callbacks: Optional[List[Callable[["Handle"], None]]] = None
        if not outputs:
            self._event.set()

    def _finish_one(self, error: Optional[BaseException] = None) -> None:
        with self._event.lock:
            if error is not None and self._error is None:
                self._error = error
            self._remaining -= 1
            if self._remaining != 0:
                return
            self._event.set_locked()
            callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            _run_callback(fn, self)

    def done(self) -> bool:
        return self._event.is_set()

    def add_done_callback(self, fn: Callable[["Handle"], None]) -> None:
        """Call ``fn(handle)`` once the operation has finished or failed (``wait()``
        then returns or raises at once): on this thread if it already has, else on
        the netreduce thread that finishes it — so ``fn`` must be quick and must
        never wait for another operation. For adapters whose framework completes
        work by callback (TensorFlow's asynchronous kernels) rather than a wait."""
        with self._event.lock:
            if not self._event.is_set():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        _run_callback(fn, self)

    def run_if_ready(self) -> None:
        """Run this operation's data-plane step on the calling thread if it can go now
        (a steady-state step whose whole group this rank holds), as wait() does, and
        return without waiting otherwise. For an adapter that completes by callback
        (add_done_callback): its thread saves the executor's wake-up."""
        if self._helper is not None and not self._event.is_set():
            self._helper(self)

    def wait(self, timeout: Optional[float] = None) -> Any:
        self._event.waited = True  # a synchronous loop (Speculation reads it)
        if self._helper is not None and timeout is None and not self._event.is_set():
            self._helper(self)  # runs a speculative step on this thread (agreement.py)
        if not self._event.wait(timeout):
            raise OperationTimeoutError(
                f"{tensor_names(self._names or ['?'])} still in flight after waiting "
                f"{timeout} s; the operation continues: wait again, or poll() until done")
        if self._error is not None:
            raise self._error
        return list(self._outputs) if self._grouped else self._outputs[0]


def _run_callback(fn: Callable[[Handle], None], handle: Handle) -> None:
    try:
        fn(handle)
    except Exception:  # a callback's bug must not stop the thread that completes handles
        log.exception("netreduce: a handle's done callback failed")


class Tensor:
    """One tensor of one submission, from submit to completion."""

    __slots__ = ("name", "sig", "cacheable", "op", "array", "output", "handle",
                 "t_submit", "t_sent", "seq", "index")

    def __init__(self, name: str, sig: Signature, cacheable: bool, op: Optional[ReduceOp],
                 array: Optional[np.ndarray], output: Optional[np.ndarray], handle: Handle):
        self.name, self.sig, self.cacheable, self.op = name, sig, cacheable, op
        self.array, self.output, self.handle = array, output, handle
        self.index = len(handle._names)  # position among the handle's outputs
        handle._names.append(name)
        self.t_submit = tl.now_us()
        self.t_sent = 0.0
        self.seq = -1  # log position once negotiated

    @property
    def kind(self) -> str:
        return self.sig.kind

    @property
    def dtype(self) -> str:
        return self.sig.dtype
