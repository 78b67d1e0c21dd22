"""The steady state without the coordinator: Horovod's response-cache agreement,
run through netreduce's own data plane (docs/control_plane.md).

Once the coordinator has negotiated a tensor, it carries a small integer id (the
response cache, netreduce/worker/response_cache.py). A later submission of the same name with
the same signature does not go to the coordinator: the ranks agree among themselves,
with one tiny all-reduce through the aggregator (op MIN on an int32 vector) that the
executor thread runs between data-plane messages — a *round*:

    v[0]      log entries this rank has received from the coordinator (MIN: all have)
    v[1]      1 = this rank has nothing in flight (MIN: 0 when any rank is busy)
    v[2]      1 = this rank stays, 0 = it is shutting down (MIN: 0 when any rank leaves)
    v[3 + i]  cache id i: 2 = submitted here, 1 = not (yet), 0 = invalidate it

After a round every rank knows the same three things and acts on them in the same
order: (1) the coordinator's log entries below v[0], in log order — they arrived
asynchronously, so they wait for the round that proves every rank has them; (2) the
ids that are 2 everywhere, fused by fusion.plan in id order; (3) the ids that are 0:
banned, and every rank that holds one sends it to the coordinator instead, where the
usual checks, stall reports and NETREDUCE_TIMEOUT errors (naming the tensor and the
missing ranks) apply. A rank sends 0 for an id when its own signature for that name
changed (the coordinator then reports the mismatch or assigns a new id: re-caching),
when it has joined (Horovod's join needs the coordinator's zeros), and when a
submission has waited ``stale_s`` without every rank agreeing. A banned id is
allowed again once its tensor's coordinator entry has executed — the same point in
every rank's sequence.

Why the choice of path is the same on every rank: a name has one operation in
flight at a time, its next submission comes after the previous one completed, and
everything that decides the path (the id, learned before the previous execution;
the bans, applied at a round or at an execution) is fixed by then on every rank.

The data plane reads a round's vector when it starts the message: a submission made
after the round was issued and before it started (it queues behind an agreed group's
data on the wire, pipeline.py) marks itself READY in it (``live``), so that round agrees
what became ready while the data was on the wire.

A rank with work starts a round at once (or after NETREDUCE_CYCLE_TIME when it
wakes from an idle spell, to batch a burst); a rank with nothing joins rounds at
``IDLE_S`` intervals, so that a rank waiting on a tensor that another rank never
submits learns so within that (and ``stale_s`` later hands it to the coordinator,
whose timeout error names the missing ranks). A job idle for ``QUIET_S`` (every
message found every rank with nothing) backs off, doubling the pace up to
max(IDLE_S, stale_s): 2 tiny all-reduces per second instead of 20 at the default
timeout, and a missing rank is still seen within stale_s. Before a rank's first submission it runs no round: init()
still uses the flat data plane for the host-layout exchange.

A rank that shuts down says so in its last round (v[2] = 0): after that round every
rank stops running rounds (its cached submissions go to the coordinator), so no rank
is left inside a round's all-reduce waiting for one that has gone — an executor
thread still in the data plane when the interpreter exits aborts the process.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from netreduce.errors import NegotiationError, NetReduceError, tensor_names
from netreduce.protocol import fusion
from netreduce.protocol.signature import fusion_key, nbytes
from netreduce.worker import timeline as tl
from netreduce.worker.executor_wakes import ExecutorWakes
from netreduce.worker.handle import Handle, Tensor
from netreduce.worker.pipeline import Pipeline
from netreduce.worker.speculation import Speculation
from netreduce.worker.wake_queue import WAKE, WakeQueue

BITS_SEQ = -2               # Tensor.seq of a submission waiting in the agreement
GROUP_SEQ = -1              # executing a group agreed by a round (no log position)
ROUND_SEQ = 1 << 62         # executing a round: any failure aborts it
ROUND_ROW = "(agreement rounds)"  # the timeline's row of the rounds
INVALID, WAITING, READY = 0, 1, 2
HEADER = 3
MAX_WIDTH = 4096            # ids a round covers (int32 each); larger ids stay with the coordinator
IDLE_S = 0.05               # a rank with nothing follows others' rounds at this pace at most
QUIET_S = 1.0               # ... and backs off once every rank has had nothing for this long
NOTICE_GRACE_S = 2.0        # a failed round waits this long for the coordinator's reason


class Agreement:
    """One communicator's rounds. ``route`` runs on user threads (under the
    communicator's lock), ``loop`` is the executor thread, reading the executor's
    queue ``q``. Of the communicator it uses only its interface for helpers
    (communicator.py, "the state its helpers see"); its own lock comes after the
    communicator's where both are held (route)."""

    def __init__(self, comm: Any, q: WakeQueue, width: int, threshold: int) -> None:
        self.comm, self.q = comm, q
        self.width = max(0, min(int(width), MAX_WIDTH))
        self.threshold = int(threshold)
        self.stale_s = min(0.5, 0.05 * comm.timeout_s)
        self.lock = threading.Lock()
        self.pending: Dict[int, Any] = {}       # id -> Tensor submitted here, not agreed
        self.since: Dict[int, float] = {}       # id -> when (monotonic)
        self.invalidate: Set[int] = set()       # ids to send as 0 next round
        self.banned: Set[int] = set()
        self.armed = False
        self.off: Optional[bool] = None         # decided at the first submission
        self.leaving = False                    # this rank's shutdown: said in its next round
        self.said_leaving = False               # ... and that round has run
        self.joins: List[Any] = []              # this rank's join()s routed, not yet done
        self.stepping: Optional[str] = None     # the name a steady call runs (steady)
        self.spec = Speculation(self)           # steady steps in one message (speculation.py)
        # Agreed groups' messages in flight while this loop runs the next round
        # (pipeline.py); only the executor submits, under run_lock.
        self.pipeline = Pipeline(comm)
        # One message at a time, from the executor or a waiting user thread (help):
        # run_lock guards what follows and the speculation's state.
        self.run_lock = threading.Lock()
        self.held: List[Tuple[int, list]] = []  # log entries received, not yet agreed
        self.received = 0                       # log entries received (v[0])
        self.hot = False                        # the last message found a rank busy
        # Who wakes the executor for a submission, and when it polls instead
        # (executor_wakes.py): decided under ``lock``.
        self.wakes = ExecutorWakes(q, self.lock)
        self.last_message = time.monotonic()
        self.gap = IDLE_S                       # the idle pace now (backs off when quiet)
        self.quiet_since: Optional[float] = None
        # A round's vector is read by the data plane when it starts the message, not
        # when the executor issues it: submissions made meanwhile mark themselves in
        # it (``live``, route), so a round queued behind an agreed group's data agrees
        # what became ready while that data was on the wire. Its result lands apart.
        self.vec = np.empty(HEADER + self.width, dtype=np.int32)
        self.result = np.empty_like(self.vec)
        self.live = False                       # a round of vec is issued, not returned
        self.live_marks = 0                     # statistics: submissions marked so
        self.rounds = 0                         # statistics (tests, benchmarks)
        self.agreed = 0                         # tensors executed without the coordinator
        self.fallbacks = 0                      # tensors sent back to the coordinator

    # --- user threads -------------------------------------------------------------
    def route(self, tensors: List[Any]) -> List[Any]:
        """Take the submissions that every rank sends through the agreement; return
        the rest (for the coordinator). Caller holds the communicator's lock."""
        rest, took, live = [], False, False
        cache = self.comm.cache
        with self.lock:  # off is set under it (_end): nothing is routed here after
            if self.off is None:
                # Rounds and speculative messages are calls of comm.dp like any other: under
                # failover (netreduce/worker/failover.py) an interrupted one completes on the
                # next path with the same result on every rank (docs/failover.md, "Rounds").
                self.off = False
            if self.off:
                return tensors
            self.armed = True
            for t in tensors:
                known = cache.id_of.get(t.name)
                if known is None or t.kind == "join":
                    if t.kind == "join":  # every id goes as 0 until its entry came (joined)
                        self.joins.append(t)
                    rest.append(t)
                    continue
                i, sig = known
                if sig != t.sig or i >= self.width or i in self.banned:
                    if sig != t.sig and i < self.width:
                        self.invalidate.add(i)  # the others may hold it here
                    rest.append(t)
                    continue
                t.seq = BITS_SEQ
                t.handle._helper = self.help
                cache.hits += 1
                self.pending[i] = t
                self.since[i] = time.monotonic()
                took = True
                if self.live and self.vec[HEADER + i] == WAITING:
                    self._mark_live(i)
            live = self.live
            # Left to a wait: a submission that completes the speculative group, on a
            # rank whose user waited for the last one, while the executor polls.
            # Decided under ``lock``, where the executor decides whether it polls.
            left = self.wakes.leave(took and not rest and not live and self.spec.waited
                                    and self.spec.covered())
        self.wakes.routed(bool(rest), took, live, left)
        return rest

    def _mark_live(self, i: int) -> None:
        """Mark id ``i`` ready in the round that is issued and may not have started
        yet (caller holds ``lock``). Safe whenever the data plane reads it: a mark only
        ever goes from WAITING to READY, each id independently, so whatever the data
        plane read of each word (before or after, at a resend or a failover's re-run)
        is a value the word held while ``i`` was pending here; an id the round agrees
        on is then one every rank holds, and one it missed waits for the next round,
        whose fill marks it again."""
        self.vec[HEADER + i] = READY
        self.vec[1] = 0                         # busy: something is in flight here
        self.live_marks += 1

    # --- executor thread ------------------------------------------------------------
    def loop(self) -> None:
        try:
            self._loop()
        finally:
            self.pipeline.close()               # what is in flight lands first

    def _loop(self) -> None:
        comm, q = self.comm, self.q
        stopping = False
        while True:
            if comm.failure() is not None or not self.armed:
                # The plain executor: entries as they come (after a failure, those up
                # to ``after`` still run; the communicator's rules decide). Entries
                # held for a round that will not come go first: their handles wait.
                with self.run_lock:
                    if comm.failure() is not None:
                        self._run_held(len(self.held))
                if stopping:
                    return
                items = q.take(None)
                with self.run_lock:
                    # Counted here too: the first submission arms the rounds, and its
                    # log entry may come in the same batch as its wake (a slow
                    # executor); uncounted, no round would ever run it.
                    if self._hold(items):
                        stopping = True
                    if comm.failure() is not None or not self.armed:
                        self._run_held(len(self.held))
                        if stopping:
                            return
                continue
            # Read without run_lock (only this thread changes ``held``; the rest only
            # sets how long to wait), so that a poll never delays a user's help.
            # ``owed`` cleared first: a submission that set it is in ``pending`` now.
            self.wakes.looked()
            local = bool(self.held or self.pending or self.invalidate)
            if stopping and not self.held and self.said_leaving:
                return
            due = self.last_message + self.gap - time.monotonic()
            # With work here: a message now. Without: follow the others' messages, at
            # IDLE_S at most, so that a rank waiting for us learns within that that
            # we have not submitted its tensor (and can fall back to the coordinator).
            wait = 0.0 if local or stopping else max(0.0, due)
            # POLL_S while we poll (executor_wakes.py): route leaves one to a wait only then
            items = q.take(self.wakes.wait(self.spec.armed, wait))
            if not local and not self.hot and items and comm.cycle_s > 0:
                time.sleep(comm.cycle_s)        # woke from idle: let the burst arrive
                items += q.take(0.0)
            if not stopping and all(item is WAKE for item in items) and time.monotonic() - \
                    self.last_message < self.gap and not (self.held or self.pending or self.invalidate):
                continue                        # a poll, or work a user thread ran (help)
            with self.run_lock:
                if self._hold(items):
                    stopping = self.leaving = True
                if comm.failure() is not None or not self.armed:
                    continue
                if not (self.held or self.pending or self.invalidate or stopping) and \
                        time.monotonic() - self.last_message < self.gap:
                    continue                    # a waiting user thread ran it meanwhile
                self._message()

    def _hold(self, items: List[Any]) -> bool:
        """Hold the log entries among ``items`` (the executor's queue) for the round
        that proves every rank has them, counted as received (v[0]); True when one
        says the executor stops. Caller holds run_lock."""
        stop = False
        for item in items:
            if item is None:
                stop = True
            elif item is not WAKE:
                self.held.append(item)
                self.received = max(self.received, item[0] + 1)
        return stop

    def help(self, handle: Any) -> None:
        """Handle.wait on a user thread: while the next message is speculative and
        this rank holds all of its group, run it here rather than wake the executor
        and wait to be woken back (two thread hand-offs per step). The run lock
        keeps one message at a time; either thread may issue it, the sequence of
        messages is the same."""
        comm, spec = self.comm, self.spec
        while not handle._event.is_set() and spec.armed:
            self.run_lock.acquire()             # the executor may be issuing one
            try:
                idle = self.wakes.only_wakes()
                with self.lock:
                    mine = spec.ids is not None and spec.idset <= self.pending.keys()
                if not (idle and mine and not self.held and comm.failure() is None):
                    break
                self._message(by_user=True)
            finally:
                self.run_lock.release()
        # Not (or no longer) ours: the executor's (a wake-up if one is owed).
        self.wakes.waited(handle._event.is_set(), self.pending)

    def steady(self, name: str, sig: Any, op: Any, array: np.ndarray, output: np.ndarray) -> bool:
        """A synchronous all-reduce of ``name`` (signature ``sig``) in the steady state,
        on the caller's thread in one call (netreduce/api.py): when the speculation is
        armed on that lone tensor and nothing else waits here, the message is the one
        its submission (route) and wait (help) would issue, without their Tensor,
        Handle, queue and locks. True when ``output`` holds the result -- or, if not
        every rank voted for it, once the round that follows ran it, as on the usual
        path. False, with nothing done, when this is not that state: the caller takes
        the usual path. A failure raises the job's error."""
        spec, comm = self.spec, self.comm
        if spec.lone != name or comm.timeline or not self.run_lock.acquire(False):
            return False                        # (the executor is issuing a message)
        try:
            ids = spec.ids
            if ids is None or spec.lone != name or spec.sigs[0] != sig or self.held:
                return False
            i = ids[0]
            lock = self.lock            # acquire/release, not `with` (~0.5 µs a hold here:
            lock.acquire()              # Communicator.claim)
            try:
                known = comm.cache.id_of.get(name)
                if self.off or self.pending or self.invalidate or self.joins or self.leaving \
                        or known is None or known[0] != i or known[1] != sig or i in self.banned:
                    return False
            finally:
                lock.release()
            cleared = self.q.clear_wakes()      # wakes.only_wakes, one frame less
            if cleared is None:
                return False
            if cleared:
                self.wakes.owed = True          # (if the claim fails, the usual path's wait puts it)
            if not comm.claim(name):            # and the message begins
                return False
            t = None
            try:
                now = time.monotonic()
                self.last_message, self.hot = now, True
                comm.cache.hits += 1
                self.stepping = name            # a failure's error names it
                try:
                    done = spec.run_lone(array, output)
                finally:
                    self.stepping = None
                self.quiet_since, self.gap = None, IDLE_S  # _pace(False)
                if done is None:                # failed (reported): the job's error
                    error = comm.error_for([name])
                    raise error if error is not None else NetReduceError(
                        f"rank {comm.rank}: the steady all-reduce of '{name}' failed")
                if done:
                    if cleared:
                        self.wakes.settle(self.pending)  # (others' wake-ups, cleared above)
                    return True
                # Not every rank voted for it: the submission waits for the round
                # that follows, as route would have left it.
                handle = Handle([output], False)
                t = Tensor(name, sig, True, op, array, output, handle)
                t.seq = BITS_SEQ
                handle._helper = self.help
            finally:
                comm.unclaim(name, t)           # and the message ends
            with self.lock:
                self.pending[i] = t
                self.since[i] = now
        finally:
            self.run_lock.release()
        handle.wait()
        return True

    def _message(self, by_user: bool = False) -> None:
        """The next data-plane message of the agreement: a speculative one or a
        round, as the previous message's result decided. Caller holds run_lock."""
        comm = self.comm
        self.last_message = time.monotonic()
        if self.spec.armed:
            # Held log entries wait for the round that follows (the speculation says
            # ``other``, so it is not speculative again).
            self.hot = True
            idle = self.spec.idle
            self.spec.run(bool(self.held), by_user)
            self._pace(self.spec.idle > idle)
            return
        result = self._round(self.received,
                             bool(self.held or self.pending or comm.busy()))
        if result is None:
            return                              # failed: the plain executor takes over
        self.hot = result[1] == 0
        self._pace(bool(result[1]))             # 1: no rank had anything in flight
        agreed_seq = int(result[0])
        ready = sum(1 for h in self.held if h[0] < agreed_seq)
        self._run_held(ready, allow=True)
        self._apply(result[HEADER:])
        if result[2] == 0:
            self._end()                         # a rank leaves: no more rounds, anywhere

    def _pace(self, quiet: bool) -> None:
        """The idle pace after a message: IDLE_S while anything happens; once every
        message has found every rank with nothing for QUIET_S, doubled per message
        up to max(IDLE_S, stale_s) (a rank waiting on us still learns within its
        stale_s, and the coordinator's timeout is far beyond)."""
        if not quiet:
            self.quiet_since, self.gap = None, IDLE_S
        elif self.quiet_since is None:
            self.quiet_since = self.last_message
        elif self.last_message - self.quiet_since > QUIET_S:
            self.gap = min(2 * self.gap, max(IDLE_S, self.stale_s))

    def _run_held(self, count: int, allow: bool = False) -> None:
        """Run the first ``count`` log entries held (in log order, as received)."""
        run, self.held = self.held[:count], self.held[count:]
        for seq, group in run:
            if allow:
                self._allow(group)
            self.comm.run_group(seq, group)

    def _round(self, received: int, busy: bool) -> Optional[np.ndarray]:
        vec = self.vec
        now = time.monotonic()
        with self.lock:
            joined = bool(self.joins) and self.joined()
            vec[0] = received
            vec[1] = 0 if busy else 1
            vec[2] = 0 if self.leaving else 1
            self.said_leaving = self.leaving
            vec[HEADER:] = WAITING
            for i in self.pending:
                vec[HEADER + i] = INVALID if now - self.since[i] > self.stale_s else READY
            for i in self.invalidate:
                vec[HEADER + i] = INVALID
            self.invalidate.clear()
            if joined:
                vec[HEADER:] = INVALID          # joined: the coordinator sends the zeros
            self.live = True
        timeline = self.comm.timeline
        t0 = tl.now_us() if timeline else 0.0
        try:
            done = self.issue(vec, "min", out=self.result)
        finally:
            with self.lock:
                self.live = False
        if not done:
            return None
        if timeline:
            timeline.span(ROUND_ROW, "round", t0, tl.now_us())
        self.rounds += 1
        return self.result.copy()

    def joined(self) -> bool:
        """Whether a join() of this rank still waits for its log entry: then every id
        goes as 0 (the coordinator sends the zeros). Caller holds ``lock``."""
        if not self.joins:
            return False
        self.joins = [t for t in self.joins if not t.handle.done()]
        return any(t.seq < 0 for t in self.joins)

    def issue(self, buf: np.ndarray, op: str, fill: Optional[Callable[[], None]] = None,
              out: Optional[np.ndarray] = None) -> bool:
        """One of the agreement's own data-plane messages (a round, a speculative
        step), ``fill()`` first writing this rank's part into ``buf``, then the
        all-reduce of ``buf`` (into ``out``, or in place): from before the fill to the
        end, a failure reported aborts the data plane under it. False when the job had
        failed or the message did (reported here: the plain executor takes over)."""
        comm = self.comm
        if not comm.begin_message():
            return False
        try:
            if fill is not None:
                fill()
            comm.dp.allreduce(buf, out, op=op)
            return True
        except Exception as exc:
            self._message_failed(exc)
            return False
        finally:
            comm.end_message()

    def step_call(self, fn: Callable[..., int], *args: Any) -> Optional[int]:
        """A message that is one call, ``fn(*args)`` (a steady step's native vote_step,
        Speculation.run_lone), inside the message Communicator.claim began (Agreement.
        steady): what it returned, or None when it failed (reported, as by issue). The
        arguments are passed, not bound: a steady step comes here once per step."""
        try:
            return fn(*args)
        except Exception as exc:
            self._message_failed(exc)
            return None

    def _message_failed(self, exc: Exception) -> None:
        """A round or a speculative message raised: report it (the plain executor
        takes over once the communicator has a failure)."""
        comm = self.comm
        if not isinstance(exc, NetReduceError):  # a bug here must not leave users hanging
            comm.report_failure(NetReduceError(
                f"rank {comm.rank}: the agreement round failed: {exc!r}"))
            return
        # A peer's death often breaks the round (shared memory notices at once)
        # just before the coordinator says who died and how: prefer its word.
        deadline = time.monotonic() + NOTICE_GRACE_S
        while comm.failure() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if comm.failure() is None:
            comm.report_failure(self._round_error(exc))

    def _round_error(self, exc: NetReduceError) -> NetReduceError:
        if getattr(self.comm.dp, "name", "") == "failover":
            return exc  # its verdict: the aggregators that failed, why no path is left
        with self.lock:
            names = [t.name for t in self.pending.values()]
        if self.stepping is not None:
            names.append(self.stepping)
        what = tensor_names(names) if names else "no cached tensor"
        return NegotiationError(
            f"rank {self.comm.rank} of job '{self.comm.job}': the ranks' agreement on cached "
            f"tensors did not complete ({what} waiting here): {exc}; a rank that neither "
            "submits nor leaves for NETREDUCE_TIMEOUT stops the job")

    def _apply(self, marks: np.ndarray) -> None:
        """Act on a round's result: bans, fallbacks, then the agreed groups."""
        invalid = np.flatnonzero(marks == INVALID)
        ready = np.flatnonzero(marks == READY)
        moved, agreed = [], []
        with self.lock:
            for i in invalid.tolist():
                self.banned.add(i)
                t = self.pending.pop(i, None)
                self.since.pop(i, None)
                if t is not None:
                    moved.append(t)
            for i in ready.tolist():
                agreed.append(self.pending.pop(i))
                self.since.pop(i, None)
        if moved:
            self._give_back(moved)
        if not agreed:
            return
        ids = ready.tolist()
        items = [(t.name, fusion_key(t.sig), nbytes(t.sig)) for t in agreed]
        groups = [(tuple(ids[k] for k in g), [agreed[k] for k in g])
                  for g in fusion.plan(items, self.threshold)]
        self.spec.agreed(groups)
        for _, tensors in groups:
            self.mark_agreed(tensors)
            if self.pipeline.takes(tensors):
                self.pipeline.start(tensors)    # on the wire behind us; the next round now
            else:
                self.comm.run_group(GROUP_SEQ, tensors)

    def mark_agreed(self, tensors: List[Any]) -> None:
        """``tensors`` run as a group every rank agreed on (a round's, or a
        speculative step's), at no position of the coordinator's log."""
        for t in tensors:
            t.seq = GROUP_SEQ
        self.agreed += len(tensors)

    def _end(self) -> None:
        """A round said a rank is leaving: from here on every rank runs the plain
        executor, and what waited for an agreement goes to the coordinator (which
        fails it naming the rank that left, as without the agreement)."""
        with self.lock:
            self.off, self.armed = True, False
            self.spec.disarm()
            moved = list(self.pending.values())
            self.pending.clear()
            self.since.clear()
        if moved:
            self._give_back(moved)

    def _give_back(self, tensors: List[Any]) -> None:
        """Submissions that wait for an agreement no longer: to the coordinator."""
        self.fallbacks += len(tensors)
        self.comm.renegotiate(tensors)

    def _allow(self, group: List[Any]) -> None:
        """A coordinator entry runs at the same point everywhere: its ids may be agreed
        on again (the next submission of the name comes after this execution)."""
        cache = self.comm.cache
        with self.lock:
            for t in group:
                known = cache.id_of.get(t.name) if t is not None else None
                if known is not None and known[1] == t.sig:
                    self.banned.discard(known[0])

