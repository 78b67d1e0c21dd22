"""Several requests in flight on one control connection (rank side).

A rank used to hold three connections to the coordinator so that its long-poll,
its submissions and its failure watch could each block on their own; 1,000 ranks
made 3,000 connections. Now each request carries an ``id`` and the control server
(netreduce/switch/loop.py) answers it whenever it can, echoing the ``id``; one
reader thread per connection hands each reply to whoever waits for it."""
from __future__ import annotations

import itertools
import os
import queue
import threading
from typing import Any, Callable, Dict, Optional

from netreduce.errors import ControlPlaneError

Deliver = Callable[[Any], None]  # gets the reply dict, or the ControlPlaneError


class Multiplexed:
    def __init__(self, conn: Any) -> None:
        self.conn = conn                       # a negotiation.LineConnection
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._waiting: Dict[int, Deliver] = {}
        self._broken: Optional[ControlPlaneError] = None
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name="netreduce-control-reader")
        self._reader.start()

    def send(self, cmd: str, deliver: Deliver, **fields: Any) -> None:
        with self._lock:
            if self._broken is not None:
                raise self._broken
            rid = next(self._ids)
            self._waiting[rid] = deliver
            try:
                self.conn.send(cmd, id=rid, **fields)
            except ControlPlaneError:
                self._waiting.pop(rid, None)
                raise

    def call(self, cmd: str, timeout: Optional[float], **fields: Any) -> Dict[str, Any]:
        """Send and wait (at most ``timeout`` s) for the reply."""
        box: "queue.Queue[Any]" = queue.Queue(1)
        self.send(cmd, box.put, **fields)
        try:
            reply = box.get(timeout=timeout)
        except queue.Empty:
            raise ControlPlaneError(f"the aggregator at {self.conn.where()} did not answer "
                                    f"'{cmd}' within {timeout} s") from None
        return checked(reply, self.conn.where())

    def _read(self) -> None:
        while True:
            try:
                reply = self.conn.recv_line()
            except ControlPlaneError as exc:
                with self._lock:
                    self._broken = exc
                    waiting, self._waiting = self._waiting, {}
                for deliver in waiting.values():
                    deliver(exc)
                return
            with self._lock:
                deliver = self._waiting.pop(reply.pop("id", None), None)
            if deliver is not None:
                deliver(reply)


def checked(reply: Any, where: str) -> Dict[str, Any]:
    """The reply's fields; ControlPlaneError for a lost connection or ok=false."""
    if isinstance(reply, ControlPlaneError):
        raise reply
    if not reply.get("ok", False):
        raise ControlPlaneError(f"aggregator {where}: {reply.get('error', 'request refused')}")
    return reply


class Mailbox:
    """One reply at a time, readable with select() (its fileno is a pipe's end): how
    the communicator's negotiation thread waits for its long-poll next to its own
    wake-up pipe."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._r, self._w = os.pipe()
        self._lock = threading.Lock()
        self._reply: Any = None

    def deliver(self, reply: Any) -> None:
        with self._lock:
            self._reply = reply
        try:
            os.write(self._w, b"x")
        except OSError:
            pass  # closed: nobody reads any more

    def pending(self) -> bool:
        with self._lock:
            return self._reply is not None

    def take(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        import select
        with self._lock:
            reply, self._reply = self._reply, None
        if reply is None:
            ready, _, _ = select.select([self._r], [], [], timeout)
            if not ready:
                raise ControlPlaneError(f"the aggregator at {self.where} did not answer "
                                        f"within {timeout} s")
            with self._lock:
                reply, self._reply = self._reply, None
        try:
            os.read(self._r, 4096)
        except OSError:
            pass
        return checked(reply, self.where)

    def fileno(self) -> int:
        return self._r

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
