"""Who wakes the agreement's executor thread, and when it polls (agreement.py).

A submission the agreement takes (``Agreement.route``) waits in ``pending`` for the
executor's next message. Either something wakes the executor for it (a ``WAKE`` on
its queue, wake_queue.py), or the executor finds it without one: inside a round it
reads ``pending`` when the round returns; with a wake-up queued it reads ``pending``
after taking it; while it *polls* it looks every POLL_S.

A submission that completes the speculative group, on a rank whose user waited for
the last one, is left to the user's wait (Agreement.help runs the message on the
user's thread), or to the executor's poll if no wait comes: waking the executor
costs more than the step (two threads of one process contending for one core). The
rules, each decided under the agreement's ``lock``:

* The executor polls (``polls``, set by it before each wait) for POLL_FOR_S after
  route last left a submission to a wait (``left_at``), or while a wake-up is owed;
  not whenever steps complete: a one-call step (Agreement.steady) leaves nothing to
  find, and a poll is a wake-up of this thread, 100 a second (~90 µs CPU each here).
* Route leaves a submission to a wait only while the executor polls; one it would
  have left marks ``left_at`` all the same, so the executor polls from its next look
  on. Otherwise it wakes the executor: an async submission nobody waits for must not
  wait for the idle pace.
* A wake-up a user's wait owes the executor (``owed``): set when route left a
  submission to that wait, or a user thread's message cleared wake-ups put for others
  (``only_wakes``); cleared where the executor reads ``pending`` (the top of its
  loop), for then it sees every submission made before. A wait that finds it clear
  puts none: its submission's own wake-up is queued or was taken after it was made,
  or the executor is in a round it returns from to read pending, or the tensor is
  past the agreement (in flight, landing, negotiated).

Every wake-up put here is the queue's deduplicating ``wake``: a wake-up carries no
data, and one already last in the queue makes the executor read ``pending`` after
every submission made before it, which is all a second one would ask.
"""
from __future__ import annotations

import threading
import time
from typing import Sized

from netreduce.worker.wake_queue import WakeQueue

POLL_S = 0.01               # while it polls: the executor's look at submissions left to a wait
POLL_FOR_S = 1.0            # ... for this long after route last left one


class ExecutorWakes:
    """One agreement's wake-up bookkeeping (see the module's doc). ``lock`` is the
    agreement's: ``polls`` and ``left_at`` are decided under it."""

    def __init__(self, q: WakeQueue, lock: threading.Lock) -> None:
        self.q, self.lock = q, lock
        self.owed = False
        self.help_wakes = 0                     # statistics: wake-ups put by user threads
        self.polls = False                      # the executor looks at pending every POLL_S
        self.left_at = -1.0                     # monotonic; < 0: never

    # --- route (a user thread) ------------------------------------------------------
    def leave(self, eligible: bool) -> bool:
        """Whether route leaves the submissions it took to a wait: ``eligible`` (they
        complete the speculative group, the user waited for the last step, none went
        to the coordinator, no round is live) and the executor polls, which then sees
        them if no wait comes. Eligible marks ``left_at``: the executor polls for
        POLL_FOR_S after it. Caller holds ``lock``."""
        if eligible:
            self.left_at = time.monotonic()
        return eligible and self.polls

    def routed(self, rest: bool, took: bool, live: bool, left: bool) -> None:
        """After route (its lock released): wake the executor for what it took or
        gave the coordinator, or owe the user's wait a wake-up (``left``).

        Not woken while it is inside a round (``live``): it clears ``live`` under
        ``lock`` after this, and then reads ``pending`` before it waits again, so it
        sees this submission without a wake-up (a backward's hooks mostly come while a
        round is on the wire). Nor when a wake-up is queued and not yet taken: the
        executor reads ``pending`` after taking it, so it sees this submission (made
        before). One check-and-put under the queue's lock (with only_wakes's clear,
        which then owes the wait this wake-up too)."""
        if rest or (took and not live and not left):
            self.q.wake()
        elif took and not live:
            self.owed = True                    # left to the user's wait (help)

    # --- the executor ---------------------------------------------------------------
    def looked(self) -> None:
        """The executor is about to read ``pending``: a submission that set ``owed``
        is there now."""
        self.owed = False

    def wait(self, armed: bool, wait: float) -> float:
        """How long the executor waits for its queue, at most ``wait``: POLL_S while it
        polls (decided here, under ``lock``, where route decides to leave one). Owed:
        a user thread cleared wake-ups meant for the executor after ``looked``; if it
        set that later, it reads ``polls`` after this and wakes it itself (settle)."""
        with self.lock:
            self.polls = self.owed or self.polling(armed)
        if self.polls:
            return min(wait, POLL_S)            # a submission left to a wait that never came
        return wait

    def polling(self, armed: bool) -> bool:
        """Whether the executor polls for submissions that route left to a wait: while
        the speculation is ``armed``, for POLL_FOR_S after route last left one."""
        return armed and self.left_at >= 0 and time.monotonic() - self.left_at < POLL_FOR_S

    # --- a user thread's message or wait --------------------------------------------
    def only_wakes(self) -> bool:
        """Whether the executor's queue holds only wake-ups: then they are cleared, for
        the caller (holding the agreement's run_lock) runs the message they asked for,
        and a wake-up is owed (others' submissions may be behind them)."""
        cleared = self.q.clear_wakes()
        if cleared:
            self.owed = True
        return cleared is not None

    def waited(self, done: bool, pending: Sized) -> None:
        """A user's wait ran what it could (Agreement.help). About to block (not
        ``done``) on what it did not run, the executor's, it pays the wake-up ``owed``:
        the executor would not see that without one (otherwise it will: a wake per
        gradient still in flight when the wait after backward reaches it costs a
        thread hand-off), even while it polls: this wait would sit out the poll. Done,
        it settles what its messages owe for others' submissions ``pending``."""
        if not self.owed:
            return
        if not done:
            self.pay()
        else:
            self.settle(pending)

    def settle(self, pending: Sized) -> None:
        """A user thread's message is over with wake-ups it cleared still owed and
        submissions ``pending`` (another thread's, nobody waiting for them): wake the
        executor now unless it polls, which would see them; else they would wait for
        the idle pace. Cheap when nothing is owed: a steady step calls it."""
        if self.owed and pending:
            with self.lock:
                pay = not self.polls
            if pay:
                self.pay()

    def pay(self) -> None:
        """Put the wake-up owed (the deduplicating ``wake``: see the module's doc)."""
        self.owed = False
        self.help_wakes += 1
        self.q.wake()
