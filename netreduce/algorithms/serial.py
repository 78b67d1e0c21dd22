"""``allreduce_async`` for an algorithm whose call blocks (hierarchical's native
pipeline, failover's recovering call): its calls run one at a time, in the order
submitted, as the engine runs a connection's requests.

An agreed group's messages (netreduce/worker/pipeline.py) are submitted and the
executor goes on to its next round, which must reach the data plane behind them on
every rank alike: the order of a rank's calls is what keeps the ranks' messages
aligned. So a blocking call (``call``) runs on the caller's thread only while nothing
is queued or running -- the usual case, at the cost of a lock -- and otherwise
queues behind what was submitted and waits; a submission (``submit``) queues, and
one worker thread, started on the first, runs the queue in order.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Deque, Optional

from netreduce.errors import DataPlaneError


class SerialRequest:
    """One submitted call: ``wait()`` returns what it returned or raises what it
    raised (the algorithm's own errors, already translated)."""
    __slots__ = ("fn", "result", "error", "event")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn: Optional[Callable[[], Any]] = fn
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.event = threading.Event()

    def done(self) -> bool:
        return self.event.is_set()

    def wait(self) -> Any:
        self.event.wait()
        if self.error is not None:
            raise self.error
        return self.result

    def run(self) -> None:
        fn, self.fn = self.fn, None  # drop the arrays' references once run
        try:
            self.result = fn() if fn is not None else None
        except BaseException as exc:  # handed to the waiter, whatever it is
            self.error = exc
        self.event.set()


class Serial:
    """The calls of one algorithm object, one at a time in submission order.

    Whoever runs a call -- a caller inline, or the worker -- holds ``_run``; the
    worker takes it before it takes a request off the queue, so "queue empty and
    ``_run`` free" means nothing submitted is pending. The inline check is two reads
    and a non-blocking acquire (~0.3 us; the one-host 4 KiB call is ~25 us)."""

    def __init__(self, name: str) -> None:
        self.name = name          # the worker thread's, for py-spy and the like
        self._run = threading.Lock()
        self._cond = threading.Condition()  # the queue has work (worker), close
        self._queue: Deque[SerialRequest] = collections.deque()
        self._thread: Optional[threading.Thread] = None
        self._closed: Optional[str] = None

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` after every call submitted before it; on this thread when the
        queue is idle. (The arguments are passed, not bound in a closure: a steady
        step calls this once per step, and a closure is one more frame and object.)"""
        if not self._queue and self._closed is None and self._run.acquire(False):
            if not self._queue:  # nothing submitted slipped in before we took it
                try:
                    return fn(*args)
                finally:
                    self._run.release()
            self._run.release()
        return self.submit(lambda: fn(*args)).wait()

    def submit(self, fn: Callable[[], Any]) -> SerialRequest:
        """Queue ``fn`` behind every earlier call; returns at once."""
        req = SerialRequest(fn)
        with self._cond:
            if self._closed is not None:
                req.error = DataPlaneError(self._closed)
                req.fn = None
                req.event.set()
                return req
            self._queue.append(req)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return req

    def busy(self) -> bool:
        """Whether a call runs or waits (unlocked: a hint)."""
        return self._run.locked() or bool(self._queue)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if self._closed is not None:
                        return
                    self._cond.wait()
            with self._run:
                try:
                    req = self._queue.popleft()
                except IndexError:  # close() emptied it meanwhile
                    continue
                req.run()

    def close(self, reason: str, wait_s: float) -> None:
        """Fail what is still queued with DataPlaneError(``reason``); wait up to
        ``wait_s`` for a running call to return (the algorithm releases what it
        uses right after). Later calls fail alike."""
        with self._cond:
            self._closed = reason
            left = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for req in left:
            req.error = DataPlaneError(reason)
            req.fn = None
            req.event.set()
        if self._run.acquire(timeout=wait_s) if wait_s > 0 else self._run.acquire(False):
            self._run.release()
