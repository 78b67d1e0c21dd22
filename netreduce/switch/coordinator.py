"""The negotiation coordinator: the aggregator-side half of Horovod's controller.

Ranks submit tensors in any order; the data plane needs every rank to issue the same
all-reduces, of the same sizes, in the same order. This module turns the first into
the second. Per job it keeps

* ``pending``: name -> the signature each rank submitted so far;
* a ``log`` of responses, one global sequence: when the last rank submits a name, the
  name is checked (mismatches become an error entry that names both values and the
  ranks) and becomes "ready"; at the end of each request the ready names are cut into
  fusion groups (fusion.plan, so every rank cuts identically) and appended. Every
  rank reads the same log from its own cursor, hence the same order;
* a response cache: a name that was negotiated before with the same signature gets a
  small integer id, and ranks send the id instead of the request. With
  ``agree`` (the job's first hello) ranks do not even send that: they agree on
  cached tensors among themselves (netreduce/worker/agreement.py) and come here only
  for new, changed or stalled ones.

Each rank holds one connection (role ``all``) carrying, by request id, its
long-poll (``negotiate``: submit + wait for new log entries), submissions made
while the poll is out, shutdown and abort, and a ``watch`` answered only when the
job fails; the roles ``poll``, ``submit``, ``watch`` on three connections still
work. A connection that closes without ``negotiate_bye`` means the rank died: the
job fails, and every other rank's pending operations fail with an error naming that
rank (their watch and their long-poll wake at once).

Horovod's ``join``: a rank out of data submits ``__join__`` (kind "join"). Until every
rank has, a joined rank counts as having submitted every other tensor; a log entry
that it did not submit carries ``zeros`` (per tensor: the request it stands for, or
None) so
that it all-reduces zeros of that dtype and shape. Broadcasts and allgathers cannot
take zeros and get Horovod's error instead. When the last rank joins, the join entry
says which rank that was (``last``) and the join state resets. The requests and
replies are netreduce/protocol/messages.py's (Negotiate, LogEntry, ...).

A rank that left (shutdown(), or died) and says hello again starts the job's next
run: a fresh JobState under the same name, which the other ranks join as they too
shut down and init() again. The previous run's state lives on, reachable only from
its own connections, until they close — so ``netreduce.shutdown(); netreduce.init()``
works on every rank whatever order the ranks get there in.

Handlers never block: one that must wait (hello for the other ranks, the long-poll,
the watch) returns a ``Wait`` (switch/waits.py) that the control server's event
loop parks and polls when the job's ``topic`` is notified — only when the log grows,
the job fails or ranks join, not on every submission. Each job has its own
Condition, so one job's requests never wait on another's lock.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from netreduce.protocol import fusion, messages
from netreduce.protocol.messages import Failure, LogEntry, TensorRequest
from netreduce.protocol.signature import (  # noqa: F401  (FIELDS: re-exported)
    FIELDS, Sig, fusion_key, mismatch_message, nbytes)
from netreduce.switch import epochs
from netreduce.switch.commands import (RequestError, register_disconnect_hook, register_handler,
                                       register_job_failure_hook)
from netreduce.switch.waits import Topic, Wait

# The largest world size: the wire's 12-bit rank field less the group rank
# (native/wire/roce.h). A larger claim is refused before anything is sized by it
# (fuzz/control_fuzzer.py found a hello whose size built a set of 10^46 ranks).
MAX_WORLD = (1 << 12) - 1


# What Horovod's controller answers for collectives that cannot take zeros from a
# joined rank (controller.cc: "... is not supported with Join at this time").
JOIN_UNSUPPORTED = {
    "broadcast": "Broadcast is not supported with Join at this time.",
    "allgather": "Allgather is not supported with Join at this time.",
    "allgatherv": "Allgather is not supported with Join at this time.",
    "reducescatter": "Reducescatter is not supported with Join at this time.",
}


class _Pending:
    __slots__ = ("sigs", "first", "warned", "cacheable", "last")

    def __init__(self, now: float) -> None:
        self.sigs: Dict[int, Sig] = {}
        self.first = now
        self.warned: set = set()
        self.cacheable = True
        self.last = -1  # a join: the rank that joined last


class JobState:
    """Negotiation state of one job. Every method runs under ``cond``."""

    def __init__(self, name: str, size: int, threshold: int, capacity: int) -> None:
        self.name, self.size = name, size
        self.threshold, self.capacity = threshold, capacity
        self.cond = threading.Condition()
        self.topic = Topic(self.cond)            # parked requests (switch/waits.py)
        self.joined: set = set()
        self.conns: Dict[int, set] = {}          # rank -> roles connected now
        self.left: Dict[int, str] = {}           # rank -> why it left
        self.failure: Optional[Failure] = None
        self.pending: Dict[str, _Pending] = {}   # insertion order = first submission
        self.ready: List[Tuple[str, _Pending]] = []
        self.by_id: Dict[int, Tuple[str, Sig]] = {}
        self.id_of: Dict[str, Tuple[int, Sig]] = {}
        self.next_id = 0
        self.log: List[LogEntry] = []
        self.base = 0                            # seq of log[0]
        self.acked: Dict[int, int] = {}          # rank -> next seq it expects
        self.at_base = 0                         # live ranks whose ack is still ``base``
        self.messages = 0                        # negotiation requests served (tests)
        # Horovod's join: ranks that called join() and count as having submitted
        # every other tensor (they contribute zeros) until all ranks have joined.
        self.join_ranks: set = set()
        self.last_join = -1
        self.previous: Optional["JobState"] = None  # the run this one replaced
        # Ranks agree on cached tensors among themselves (netreduce/worker/agreement.py):
        # fixed by the job's first hello, so that every rank runs the same rounds.
        self.agree = False
        self.epoch = 0  # an elastic job's membership epoch (switch/epochs.py); 0: none

    # --- submissions -----------------------------------------------------------
    def submit(self, rank: int, reqs: List[Any]) -> None:
        """``reqs``: cache ids and TensorRequests (messages.Negotiate's)."""
        if self.failure is not None:
            return  # the rank learns the failure from its poll; nothing more will run
        now = time.monotonic()
        for req in reqs:
            if isinstance(req, int):
                if req not in self.by_id:
                    raise RequestError(f"rank {rank} of job '{self.name}' referred to "
                                       f"unknown cached tensor id {req}")
                name, sig = self.by_id[req]
                cacheable = True
            else:
                name, sig, cacheable = req.name, req.signature(), req.cacheable
            entry = self.pending.get(name)
            if entry is None:
                entry = self.pending[name] = _Pending(now)
            if rank in entry.sigs:
                raise RequestError(f"rank {rank} submitted tensor '{name}' twice")
            entry.sigs[rank] = sig
            entry.cacheable &= cacheable
            if sig.kind == "join":
                self._join(rank, name, entry)
            elif self._complete(entry):
                del self.pending[name]
                self.ready.append((name, entry))
        logged = len(self.log)
        self._flush()
        if len(self.log) != logged:  # what parked long-polls wait for; a submission
            self.topic.notify()      # alone would wake every rank's poll for nothing

    def _complete(self, entry: _Pending) -> bool:
        """Every rank submitted it, or has joined (and will contribute zeros)."""
        if len(entry.sigs) == self.size:
            return True
        if not self.join_ranks or next(iter(entry.sigs.values())).kind == "join":
            return False
        return len(self.join_ranks.union(entry.sigs)) == self.size

    def _join(self, rank: int, name: str, entry: _Pending) -> None:
        """``rank`` called join(): what only waited for it becomes ready now (before
        the join itself, so a rank's earlier submissions complete before join()
        returns); the join is ready once every rank has joined."""
        self.join_ranks.add(rank)
        self.last_join = rank
        for other, pend in list(self.pending.items()):
            if other != name and self._complete(pend):
                del self.pending[other]
                self.ready.append((other, pend))
        if len(entry.sigs) == self.size:
            del self.pending[name]
            entry.last = self.last_join
            self.ready.append((name, entry))
            self.join_ranks = set()
            self.last_join = -1

    def _ref(self, name: str, sig: Sig, cacheable: bool, assign: Dict[str, int]) -> Any:
        """How a log entry names a tensor: its cache id when it has one (assigning one
        if there is room), else the name itself."""
        known = self.id_of.get(name)
        if known is not None and known[1] == sig:
            return known[0]
        if not cacheable or len(self.by_id) >= self.capacity:
            return name
        if known is not None:
            del self.by_id[known[0]]  # same name, new signature: old id is dead
        new_id = self.next_id  # never reused: a rank may still hold a dead id's name
        self.next_id += 1
        self.by_id[new_id] = (name, sig)
        self.id_of[name] = (new_id, sig)
        assign[name] = new_id
        return new_id

    def _append(self, entry: LogEntry) -> None:
        entry.seq = self.base + len(self.log)
        self.log.append(entry)

    def _flush(self) -> None:
        if not self.ready:
            return
        good: List[Tuple[str, _Pending]] = []
        for name, entry in self.ready:
            err = mismatch_message(name, entry.sigs)
            kind = next(iter(entry.sigs.values())).kind
            if not err and len(entry.sigs) < self.size and kind in JOIN_UNSUPPORTED:
                err = (f"{JOIN_UNSUPPORTED[kind]} Tensor '{name}': rank(s) "
                       f"{', '.join(map(str, sorted(set(range(self.size)) - set(entry.sigs))))}"
                       " have joined.")
            if err:
                self._append(LogEntry(0, [name], error=err))
            else:
                good.append((name, entry))
        self.ready = []
        items = []
        for name, entry in good:
            sig = next(iter(entry.sigs.values()))
            items.append((name, fusion_key(sig), nbytes(sig)))
        for group in fusion.plan(items, self.threshold):
            assign: Dict[str, int] = {}
            refs = []
            zeros: List[Optional[TensorRequest]] = []
            for i in group:
                name, entry = good[i]
                sig = next(iter(entry.sigs.values()))
                refs.append(self._ref(name, sig, entry.cacheable, assign))
                # joined ranks never submitted it: tell them what to send zeros for
                zeros.append(TensorRequest.of(name, sig) if len(entry.sigs) < self.size
                             else None)
            # entry.last >= 0: a join (never fused), and who joined last
            self._append(LogEntry(0, refs, assign=assign,
                                  zeros=zeros if any(z is not None for z in zeros) else [],
                                  last=entry.last))

    # --- reading the log -------------------------------------------------------
    def ack(self, rank: int, seq: int) -> None:
        old = self.acked.get(rank, self.base)
        self.acked[rank] = new = max(old, seq)
        # Only the last live rank to move past the oldest entry can free log entries:
        # count those still there instead of taking the minimum over 1,000 ranks on
        # every request.
        if rank in self.left or new == old or old != self.base:
            return
        self.at_base -= 1
        if self.at_base <= 0:
            self._trim()

    def joined_at_base(self, rank: int) -> None:
        if rank not in self.acked:
            self.acked[rank] = self.base
            self.at_base += 1

    def gone(self, rank: int) -> None:
        """``rank`` just left: it no longer holds the log back."""
        if self.acked.get(rank) == self.base and rank in self.joined:
            self.at_base -= 1
            if self.at_base <= 0:
                self._trim()

    def _trim(self) -> None:
        live = [self.acked.get(r, self.base) for r in self.joined if r not in self.left]
        low = min(live) if live else self.base + len(self.log)
        if low > self.base:
            del self.log[:low - self.base]
            self.base = low
        self.at_base = sum(1 for v in live if v == self.base)

    def since(self, seq: int) -> List[LogEntry]:
        return self.log[max(0, seq - self.base):]

    def stalls(self, rank: int, stall_s: float) -> List[messages.Stall]:
        now, found = time.monotonic(), []
        for name, entry in self.pending.items():
            if self._may_stall(entry, rank) and now - entry.first >= stall_s:
                entry.warned.add(rank)
                found.append(messages.Stall(name, sorted(set(range(self.size)) - set(entry.sigs)
                                                         - self.join_ranks),
                                            round(now - entry.first, 1)))
        return found

    def next_stall(self, rank: int, stall_s: float) -> Optional[float]:
        """When (monotonic) the next of ``rank``'s pending tensors becomes a stall
        that stalls() would report (None: none can): the long poll wakes then."""
        due = [entry.first + stall_s for entry in self.pending.values()
               if self._may_stall(entry, rank)]
        return min(due, default=None)

    @staticmethod
    def _may_stall(entry: Any, rank: int) -> bool:
        """Whether ``entry`` can still be reported to ``rank`` as a stall: it submitted
        it, has not been told yet, and it is no join (a joined rank waiting for the
        others is no stall)."""
        return (rank in entry.sigs and rank not in entry.warned
                and next(iter(entry.sigs.values())).kind != "join")

    def fail(self, message: str, rank: int, after: Optional[int]) -> None:
        if self.failure is None:
            self.failure = Failure(message, rank, after)
            self.topic.notify()


# --- handlers -------------------------------------------------------------------
_registry_lock = threading.Lock()


def _jobs(srv: Any) -> Dict[str, JobState]:
    # Our own table on the server object rather than JobRecord.extra: negotiation
    # state must exist before the data plane registers and outlive its release.
    with _registry_lock:
        table = getattr(srv, "_nr_negotiation", None)
        if table is None:
            table = {}
            setattr(srv, "_nr_negotiation", table)
        return table


def _session(srv: Any, sess: Any) -> Tuple[JobState, int]:
    bound = sess.state.get("negotiation")
    if bound is None:
        raise RequestError("negotiate_hello must come first on this connection")
    job, rank, _ = bound
    # The run this connection joined, even when a newer run took over the name.
    state = sess.state.get("negotiation_state") or _jobs(srv).get(job)
    if state is None:
        raise RequestError(f"job '{job}' is gone from the aggregator")
    return state, rank


def handle_hello(srv: Any, sess: Any, msg: messages.NegotiateHello) -> Wait:
    job, rank, size, role = msg.job, msg.rank, msg.size, msg.role
    if not 1 <= size <= MAX_WORLD:
        raise RequestError(f"job '{job}' (rank {rank}): world size {size} out of range "
                           f"1..{MAX_WORLD}")
    if not (0 <= rank < size):
        raise RequestError(f"rank {rank} is outside [0, {size}) for job '{job}'")
    if sess.state.get("negotiation") is not None:  # its close would end only the last
        raise RequestError(f"rank {rank} of job '{job}': this connection already said hello "
                           f"as {sess.state['negotiation'][2]} of rank "
                           f"{sess.state['negotiation'][1]} of job "
                           f"'{sess.state['negotiation'][0]}'; one per connection")
    admit = getattr(srv, "admit", None)  # the job-secret check (protocol/auth.py)
    if admit is not None:
        admit(sess, job, rank, msg.auth)
    table = _jobs(srv)
    refused = getattr(srv, "job_failure", lambda name: "")(job)  # at admission (server.py)
    epoch = msg.epoch  # an elastic job's membership (switch/epochs.py)
    with _registry_lock:
        state = table.get(job)
        previous = None
        if state is not None:
            with state.cond:
                if epoch and epoch != state.epoch:
                    if epoch < state.epoch:
                        raise epochs.stale(job, rank, epoch, state.epoch)
                    previous, state = state, None  # the job moves to a new membership
                elif epoch and rank in state.left:
                    raise RequestError(f"rank {rank} of job '{job}' already left membership "
                                       f"epoch {epoch}; it rejoins in a later epoch")
                elif rank in state.left:
                    # This rank left that run (shutdown() or death) and is back: it
                    # starts the job's next run, which the others join as they return.
                    previous, state = state, None
        if state is None:
            state = table[job] = JobState(job, size, msg.threshold, msg.capacity)
            state.agree = msg.agree
            state.epoch = epoch
            state.previous = previous
            if previous is not None:
                previous.previous = None  # keep one run back, not the whole history
                if epoch:  # its members still bound to it are stale: tell them now
                    with previous.cond:
                        previous.fail(f"job '{job}' moved to membership epoch {epoch} (world "
                                      f"size {previous.size} -> {size}); this rank's epoch "
                                      f"{previous.epoch} is over", -1, None)
    with state.cond:
        if refused:
            state.fail(refused, -1, None)
        if state.size != size:
            # The job cannot start: the ranks waiting for this one hear it now.
            message = (f"job '{job}': rank {rank} says world size {size} but the job was "
                       f"registered with {state.size}")
            state.fail(message, -1, None)
            raise RequestError(message)
        roles = state.conns.setdefault(rank, set())
        if role in roles:
            raise RequestError(f"rank {rank} of job '{job}' is already connected (two "
                               "processes with the same rank, or a stale job name?)")
        roles.add(role)
        sess.state["negotiation"] = (job, rank, role)
        sess.state["negotiation_state"] = state
        if role not in ("poll", "all"):  # "all": one connection, requests by id
            return messages.NegotiateHelloReply(size=size)  # type: ignore[return-value]
        state.joined.add(rank)
        state.joined_at_base(rank)
        if len(state.joined) >= size:
            # Only the last join changes what a parked request sees (the hellos it
            # releases): a notify per join re-polled every parked hello, N^2/2 polls
            # (500,000 at 1,000 ranks) on the event loop before the job could start.
            state.topic.notify()
        deadline = time.monotonic() + msg.timeout

        def joined(w: Wait) -> Optional[messages.NegotiateHelloReply]:
            if state.failure is not None:
                raise RequestError(state.failure.message)
            if len(state.joined) >= size:
                return messages.NegotiateHelloReply(
                    size=size, seq=state.base + len(state.log), agree=state.agree,
                    capacity=state.capacity, threshold=state.threshold)
            if time.monotonic() >= deadline:
                missing = sorted(set(range(size)) - state.joined)
                raise RequestError(f"rank{'s' if len(missing) > 1 else ''} "
                                   f"{', '.join(map(str, missing))} of job '{job}' did not "
                                   f"join within {msg.timeout:g} s"
                                   f"{_still_in_previous_run(state, missing)}")
            w.due = deadline
            return None
        return Wait(state.topic, joined, deadline)  # type: ignore[arg-type]


def _still_in_previous_run(state: JobState, missing: List[int]) -> str:
    """Why a restarted job may wait in vain: ranks still in its previous run."""
    prev = state.previous
    if prev is None:
        return ""
    with prev.cond:
        stuck = [r for r in missing if prev.conns.get(r) and r not in prev.left]
    if not stuck:
        return ""
    return (f"; rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck))} "
            "never left the job's previous run: a job restarts only once every rank "
            "has called shutdown() and then init()")


def handle_negotiate(srv: Any, sess: Any, msg: messages.Negotiate) -> Wait:
    state, rank = _session(srv, sess)
    wait_s = min(msg.wait_ms / 1000.0, 30.0)
    stall_s = msg.stall_s
    with state.cond:
        state.messages += 1
        if msg.reqs:
            state.submit(rank, msg.reqs)
        ack = msg.ack
        state.ack(rank, ack)
        deadline = time.monotonic() + wait_s

        def news(w: Wait) -> Optional[messages.NegotiateReply]:
            entries, stalls = state.since(ack), state.stalls(rank, stall_s)
            now = time.monotonic()
            if not (entries or stalls or state.failure is not None or now >= deadline):
                # look again at the next stall deadline among its tensors (a report
                # later than that can miss the rank's NETREDUCE_TIMEOUT, 4/3 of it)
                stall_at = state.next_stall(rank, stall_s)
                w.due = deadline if stall_at is None else min(deadline, max(stall_at, now + 0.01))
                return None
            return messages.NegotiateReply(entries=entries, stalls=stalls,
                                           failure=state.failure)
        return Wait(state.topic, news, deadline)  # type: ignore[arg-type]


def handle_submit(srv: Any, sess: Any, msg: messages.NegotiateSubmit) -> messages.Empty:
    state, rank = _session(srv, sess)
    with state.cond:
        state.messages += 1
        state.submit(rank, msg.reqs)
    return messages.Empty()


def handle_watch(srv: Any, sess: Any, msg: messages.NegotiateWatch) -> Wait:
    """Answered only when the job fails (or this rank leaves): the one request that
    tells a rank, at once, that another rank is gone — even while it is busy in the
    data plane and has no negotiation outstanding."""
    state, rank = _session(srv, sess)

    def failed(w: Wait) -> Optional[messages.WatchReply]:
        if state.failure is not None:
            return messages.WatchReply(failure=state.failure)
        return messages.WatchReply() if rank in state.left else None
    return Wait(state.topic, failed)  # type: ignore[arg-type]


def handle_bye(srv: Any, sess: Any, msg: messages.NegotiateBye) -> messages.Empty:
    """Clean shutdown of a rank: entries up to ``done`` were executed by it, so other
    ranks may finish those; anything later can never complete.

    The ranks that stay hear it at once (their watch), whether or not they have
    anything in flight: what they already submitted fails now, and a transfer
    waiting for the departed rank is cut rather than left to the data-plane timeout.
    The message states only what happened; a rank turns it into an error for an
    operation that needs the departed rank (naming that operation) only when it has
    one, so a rank with nothing left to do sees no error and can shut down
    cleanly (worker/communicator.py, Communicator.error_for)."""
    state, rank = _session(srv, sess)
    with state.cond:
        if rank not in state.left:
            state.left[rank] = "shutdown"
            state.gone(rank)
        state.topic.notify()  # releases this rank's own watch
        if len(state.left) < state.size:
            state.fail(f"rank {rank} called shutdown() and left the job, whose "
                       f"collectives need all {state.size} ranks", rank, msg.done)
    return messages.Empty()


def handle_abort(srv: Any, sess: Any, msg: messages.NegotiateAbort) -> messages.Empty:
    state, rank = _session(srv, sess)
    with state.cond:
        state.fail(f"rank {rank} failed: {msg.reason}", rank, None)
    return messages.Empty()


def on_disconnect(srv: Any, sess: Any) -> None:
    bound = getattr(sess, "state", {}).get("negotiation")
    if bound is None:
        return
    job, rank, role = bound
    table = _jobs(srv)
    state = sess.state.get("negotiation_state") or table.get(job)
    if state is None:
        return
    with state.cond:
        state.conns.get(rank, set()).discard(role)
        if rank not in state.left:
            state.left[rank] = "disconnected"
            state.gone(rank)
            state.fail(f"rank {rank} disconnected from the aggregator without calling "
                       "shutdown() (the process died or was killed)", rank, None)
        gone = all(not state.conns.get(r) for r in state.conns)
    if gone:
        with _registry_lock:
            if table.get(job) is state:
                del table[job]  # job name free for the next launch


HANDLERS = {
    messages.NegotiateHello: handle_hello,
    messages.Negotiate: handle_negotiate,
    messages.NegotiateSubmit: handle_submit,
    messages.NegotiateWatch: handle_watch,
    messages.NegotiateBye: handle_bye,
    messages.NegotiateAbort: handle_abort,
}


# The control server answers these (switch/commands.py); the unit tests' fake server
# (tests/unit/fakes.py) calls the same handlers from this table.
for _cmd, _fn in HANDLERS.items():
    register_handler(_cmd, _fn, inline=True)
def on_job_failure(srv: Any, job: str, message: str) -> None:
    """The job's admission failed for good (server.py): fail its negotiation, so
    that a rank waiting in its hello hears why at once."""
    state = _jobs(srv).get(job)
    if state is not None:
        with state.cond:
            state.fail(message, -1, None)


register_disconnect_hook(on_disconnect)
register_job_failure_hook(on_job_failure)
