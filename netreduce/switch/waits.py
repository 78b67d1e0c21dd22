"""Replies that are not ready yet, without a thread per waiting request.

A control request may have to wait: a rank's hello for the other ranks, a long-poll
for the next log entry, a watch for the job's failure, the last register for the
others to learn the payload. A handler does not block for that; it returns a
``Wait``: a ``poll`` function, called with its topic's condition held, that returns
the reply (or raises the handler's error) once it can, else None, and may set
``due`` (monotonic seconds) to be polled again then even if nothing happened —
deadlines and stall reports. Code that changes what a wait looks at calls the
topic's ``notify`` (with the condition held) instead of ``notify_all``.

The control server (netreduce/switch/server.py) parks waits and polls them on its
event-loop thread whenever their topic is notified or ``due`` passes, so 1,000
ranks' waiting requests cost 1,000 small objects, not 1,000 threads. ``block``
resolves a wait on the calling thread instead (a thread-per-connection server, the
unit tests' fake, the fuzzer)."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Optional, Set

Reply = Dict[str, Any]


class Topic:
    """A condition plus the parked waits that depend on what it guards."""

    def __init__(self, cond: Optional[threading.Condition] = None) -> None:
        self.cond = cond if cond is not None else threading.Condition()
        self.waiters: Set["Wait"] = set()

    def notify(self) -> None:
        """Wake blocked threads and schedule a poll of every parked wait. Call with
        ``cond`` held."""
        self.cond.notify_all()
        for w in list(self.waiters):
            w.fire()


class Wait:
    def __init__(self, topic: Topic, poll: Callable[["Wait"], Optional[Reply]],
                 due: Optional[float] = None) -> None:
        self.topic = topic
        self.poll = poll
        self.due = due              # poll again at this monotonic time at the latest
        self.on_fire: Optional[Callable[["Wait"], None]] = None  # set by the server
        self.scheduled = False      # a poll is queued already (coalesces notifies)
        self.done = False

    def fire(self) -> None:
        if self.on_fire is not None and not self.scheduled and not self.done:
            self.scheduled = True
            self.on_fire(self)

    def block(self) -> Reply:
        """Wait on this thread until ``poll`` answers (or raises)."""
        with self.topic.cond:
            while True:
                reply = self.poll(self)
                if reply is not None:
                    self.done = True
                    return reply
                timeout = None if self.due is None else max(0.0, self.due - time.monotonic())
                self.topic.cond.wait(timeout)


def resolve(reply: Any) -> Reply:
    """A handler's answer as a reply dict, blocking on a Wait if it is one."""
    return reply.block() if isinstance(reply, Wait) else reply
