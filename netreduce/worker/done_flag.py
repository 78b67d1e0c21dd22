"""A handle's completion flag: the part of threading.Event a Handle uses (set,
is_set, wait), without building an Event for every operation.

A threading.Event is a Condition over a Lock, a few microseconds to create — as
much as the rest of a small all-reduce's Python on the cached path, where the wait
usually finds the operation finished (Agreement.help ran the step on the waiting
thread). Here a waiter that must really block creates the Event itself, under the
flag's lock, so set() either sees it and wakes it, or ran first and the waiter
never blocks.
"""
from __future__ import annotations

import threading
from typing import Optional


class DoneFlag:
    __slots__ = ("lock", "_set", "_event", "waited")

    def __init__(self) -> None:
        self.lock = threading.Lock()  # also guards the owning Handle's counters
        self._set = False
        self._event: Optional[threading.Event] = None  # only once a waiter blocks
        self.waited = False  # a thread called the handle's wait() (set by Handle.wait)

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Mark done and wake any waiter."""
        with self.lock:
            self.set_locked()

    def set_locked(self) -> None:
        """set() for a caller that holds ``lock`` (a waiter decides under it)."""
        self._set = True
        event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """True once set; False when ``timeout`` seconds passed first (as Event.wait)."""
        if self._set:
            return True
        with self.lock:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)
