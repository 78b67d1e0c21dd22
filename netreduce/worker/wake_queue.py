"""The executor's queue (communicator.py's ``_exec_q``): the coordinator's log entries,
``None`` (stop), and wake-ups (``WAKE``: new local work for the agreement's rounds,
agreement.py).

A wake-up carries no data, only "look at ``pending``": one queued and not yet taken
is as good as many. A backward's hooks submit a gradient each, so the queue's own
steps are taken here under its lock, each in one hold: a wake-up put only behind no
other (``wake``), everything taken at once (``take``), wake-ups cleared when they are
all there is (``clear_wakes``). The queue is unbounded (no put waits for room) and
nobody joins it (no task counts to keep).
"""
from __future__ import annotations

import queue
from typing import Any, List, Optional

WAKE = ("wake",)            # put on the executor's queue: new local work


class WakeQueue(queue.Queue):  # type: ignore[type-arg]
    """queue.Queue with the executor's batched steps (see the module's doc)."""

    def wake(self) -> None:
        """Put a wake-up unless the last item queued is one: the executor reads
        ``pending`` after taking it, so it sees every submission made before."""
        with self.not_empty:
            if not (self.queue and self.queue[-1] is WAKE):
                self.queue.append(WAKE)
                self.unfinished_tasks += 1
                self.not_empty.notify()

    def take(self, wait: Optional[float]) -> List[Any]:
        """Everything queued; blocks up to ``wait`` seconds (None: until one item)
        first, then the rest in one hold of the lock, not a get_nowait (a lock, a
        notify) per item."""
        items = []
        try:
            if wait is None:
                items.append(self.get())
            elif wait > 0:
                items.append(self.get(timeout=wait))
        except queue.Empty:
            pass
        with self.mutex:
            items.extend(self.queue)
            self.queue.clear()
        return items

    def clear_wakes(self) -> Optional[bool]:
        """When only wake-ups are queued: clear them, and say whether there were any
        (True) or none (False). None, leaving the queue as it is, when it holds
        anything else."""
        self.mutex.acquire()        # (not `with`: a steady step calls this; see
        try:                        # Communicator.claim)
            q = self.queue
            if not q:               # the steady step's usual case
                return False
            for item in q:
                if item is not WAKE:
                    return None
            q.clear()
            return True
        finally:
            self.mutex.release()
