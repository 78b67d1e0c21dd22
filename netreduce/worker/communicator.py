"""The communicator: one per process, two threads.

* The negotiation thread owns the coordinator connections. It batches what the
  user submitted during one cycle (NETREDUCE_CYCLE_TIME), sends it, and waits with
  select() on the long-poll socket and on a wake-up pipe; each log entry it receives
  is one fusion group, handed to the executor in log order.
* The executor thread runs the groups strictly in log order — the order is what
  keeps every rank's data-plane messages aligned — through the fusion buffer and the
  data plane, then completes the handles.

Splitting the two lets negotiation of step k+1's tensors overlap the data-plane
transfer of step k's (the transfer releases the GIL).

Failure: when the coordinator reports that a rank died or shut down, tensors still
being negotiated fail at once; groups already in the log run only if the departed
rank executed them too (``after``), otherwise the data-plane connection is aborted so
that a transfer waiting for the dead rank fails now, not at the data-plane timeout.
The report reaches every rank, busy or not; it becomes an error only for an
operation that needs the departed rank — one in flight then, or any submitted
later — and that error names the operation (error_for). A rank with nothing left to
do raises nothing and shuts down cleanly, as under Horovod.
"""
from __future__ import annotations

import logging
import os
import re
import select
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from netreduce.errors import NegotiationError, NetReduceError, RankFailedError
from netreduce.ops import ReduceOp
from netreduce.worker import timeline as tl
from netreduce.worker import unmatched
from netreduce.worker import group_message
from netreduce.worker import operation_errors
from netreduce.worker.fusion_buffer import FusionBuffer
from netreduce.worker.handle import Handle, Tensor
from netreduce.protocol.messages import Failure, NegotiateReply, TensorRequest
from netreduce.worker.negotiation import NegotiationClient
from netreduce.worker.response_cache import ResponseCache
from netreduce.worker.wake_queue import WakeQueue
from netreduce.worker.agreement import GROUP_SEQ, ROUND_SEQ, Agreement

log = logging.getLogger("netreduce")
# Seconds a transfer under way may still finish after a rank died without shutdown().
ABORT_GRACE_S = 1.0


_AUTO_NAME = re.compile(r"^(\w+)\.noname\.(\d+)(?:\.|$)")  # api._auto_name's names


class _Claim:
    """What ``_inflight`` holds for a name that a steady step runs on the caller's
    thread without a Tensor (Communicator.claim): never negotiated (seq >= 0, so
    neither a failure nor the negotiation timeout has anything of it to complete)."""
    __slots__ = ()
    seq = ROUND_SEQ
    kind = "allreduce"


_CLAIMED = _Claim()


def _zero_tensor(name: str, req: TensorRequest) -> Tensor:
    """A joined rank's stand-in for a tensor the others submitted: zeros of the same
    dtype and shape (its own handle, which nobody waits on)."""
    sig = req.signature()
    output = np.zeros(sig.shape, dtype=np.uint16 if sig.dtype == "bfloat16"
                      else np.dtype(sig.dtype))
    op = ReduceOp(sig.op) if sig.op else None
    t = Tensor(name, sig, False, op, output, output, Handle([output], False))
    t.t_sent = t.t_submit  # never negotiated by this rank: no wait to show
    return t


class Communicator:
    def __init__(self, *, rank: int, size: int, job: str, address, dataplane: Any,
                 knobs: Dict[str, Any],
                 client_factory: Callable[..., NegotiationClient] = NegotiationClient) -> None:
        self.rank, self.size, self.job, self.address = rank, size, job, address
        self.dp = dataplane
        self.cycle_s = float(knobs["NETREDUCE_CYCLE_TIME"]) / 1000.0
        self.stall_s = float(knobs["NETREDUCE_STALL_TIMEOUT"])
        self.timeout_s = float(knobs["NETREDUCE_TIMEOUT"])
        self._poll_wait_s = min(1.0, self.stall_s / 2)  # long-poll wait at the aggregator
        # The aggregator reports a tensor that some ranks have not submitted after
        # this long (the warning, and the names of the missing ranks that the
        # NETREDUCE_TIMEOUT error gives): no later than 3/4 of the timeout.
        self._stall_req_s = min(self.stall_s, 0.75 * self.timeout_s)
        self._missing: Dict[str, List[int]] = {}  # tensor name -> ranks last reported missing
        self._last_reply_us = 0.0  # when the aggregator last answered a long-poll
        self.fusion = FusionBuffer(int(knobs["NETREDUCE_FUSION_THRESHOLD"]))
        self.timeline = tl.Timeline.from_config(knobs["NETREDUCE_TIMELINE"], rank)
        self.cache = ResponseCache()
        self.neg = client_factory(address, job, rank, size,
                                  threshold=self.fusion.capacity,
                                  capacity=int(knobs["NETREDUCE_CACHE_CAPACITY"]),
                                  start_timeout=float(knobs["NETREDUCE_START_TIMEOUT"]),
                                  timeout=float(knobs["NETREDUCE_TIMEOUT"]),
                                  agree=bool(knobs.get("NETREDUCE_CACHE_AGREEMENT", True)))
        self._lock = threading.Lock()
        self._inflight: Dict[str, Tensor] = {}
        self._new: List[Tensor] = []
        self._failure: Optional[NetReduceError] = None
        self._fail_after: Optional[int] = None   # log entries <= this may still run
        # The failure is the coordinator's report that another rank left or died (or
        # the job ended there): the same text for every rank, so each operation it
        # fails gets an error of its own that names it (error_for).
        self._reported = False
        self._executing: Optional[int] = None    # seq the executor is running
        self._done_seq = -1                      # last seq the executor finished
        self._stopping = False
        self._poll_out = False
        self._wake_r, self._wake_w = os.pipe()
        self._exec_q = WakeQueue()            # log entries, None (stop), WAKE
        # Steady state without the coordinator (netreduce/worker/agreement.py), when the
        # job agreed on it at hello (every rank must run the same rounds); its loop is
        # the executor's, over the executor's queue.
        self.agreement = (Agreement(self, self._exec_q, self.neg.width, self.neg.threshold)
                          if getattr(self.neg, "agree", False) and size > 1 else None)
        self.groups_executed = 0
        self.name_counters: Dict[str, int] = {}  # auto-generated tensor names
        self.topology: Any = None  # environment.Topology, set by netreduce.init()
        self._neg_thread = threading.Thread(target=self._negotiate_loop,
                                            name="netreduce-negotiation", daemon=True)
        self._exec_thread = threading.Thread(target=self._execute_loop,
                                             name="netreduce-executor", daemon=True)
        self._watch_thread = threading.Thread(target=self._watch_loop,
                                              name="netreduce-watch", daemon=True)
        self._neg_thread.start()
        self._exec_thread.start()
        self._watch_thread.start()

    # --- submission (user threads) -------------------------------------------------
    def submit(self, tensors: Sequence[Tensor]) -> None:
        with self._lock:
            names = [t.name for t in tensors]
            if self._failure is not None:
                raise self.error_for(names) or self._failure
            if self._stopping:
                raise operation_errors.after_shutdown(self.rank, self.job, names)
            for name in names:
                if name in self._inflight or (len(names) > 1 and names.count(name) > 1):
                    raise operation_errors.already_in_flight(name)
            for t in tensors:
                self._inflight[t.name] = t
            rest = self.agreement.route(list(tensors)) if self.agreement else tensors
            self._new.extend(rest)
        if rest:
            os.write(self._wake_w, b"x")

    # --- negotiation thread --------------------------------------------------------
    def _negotiate_loop(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._stopping:
                        return
                    new, self._new = self._new, []
                    # Poll only while something awaits its log entry: tensors already
                    # handed to the executor need nothing more from the coordinator
                    # (failures come through the watch), so a steady step costs one
                    # request, not one plus an idle re-poll.
                    busy = any(t.seq == -1 for t in self._inflight.values())
                    # After a clean departure, entries up to ``after`` still run here:
                    # keep reading the log until we have them all.
                    catching_up = self._failure is not None and self._fail_after is not None \
                        and self.neg.next_seq <= self._fail_after
                if new:
                    self._send(new)
                elif busy and not self._poll_out and (self._failure is None or catching_up):
                    self._send([])
                fds = [self._wake_r] + ([self.neg.poll_conn] if self._poll_out else [])
                if self._poll_out and self.neg.poll_conn.pending():
                    ready = [self.neg.poll_conn]
                else:
                    # A long-poll answers within its wait (<= 1 s); an aggregator silent
                    # for NETREDUCE_TIMEOUT beyond that is hung or unreachable.
                    limit = self._poll_wait_s + self.timeout_s if self._poll_out else None
                    due = self._next_deadline()
                    wait = limit if due is None else max(0.0, due if limit is None
                                                         else min(limit, due))
                    ready, _, _ = select.select(fds, [], [], wait)
                    if not ready and (due is None or wait == limit):
                        raise operation_errors.aggregator_silent(self.address, limit)
                if self.neg.poll_conn in ready:
                    self._poll_out = False
                    self._on_reply(self.neg.recv_poll())
                    self._last_reply_us = tl.now_us()
                if self._expire_unmatched():
                    continue
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                    # One cycle lets the rest of a burst (a backward pass) arrive,
                    # so that it is negotiated and fused as one.
                    time.sleep(self.cycle_s)
        except NetReduceError as exc:
            self._fail(exc, None, abort=True)
        except Exception as exc:  # a bug here must not leave users hanging
            log.exception("netreduce negotiation thread failed")
            self._fail(NetReduceError(f"negotiation thread failed: {exc!r}"), None, abort=True)

    def _send(self, tensors: List[Tensor]) -> None:
        reqs = [self.cache.encode(t.name, t.sig, t.cacheable) for t in tensors]
        if self._poll_out:
            self.neg.submit(reqs)
        else:
            self.neg.send_poll(reqs, 1000.0 * self._poll_wait_s, self._stall_req_s)
            self._poll_out = True
        now = tl.now_us()
        for t in tensors:
            t.t_sent = now
            if self.timeline:
                self.timeline.span(t.name, "negotiate", t.t_submit, now)

    def _on_reply(self, reply: NegotiateReply) -> None:
        now = tl.now_us()
        for entry in reply.entries:
            self.neg.next_seq = entry.seq + 1
            with self._lock:
                # Tensors this rank never submitted because it has joined (Horovod's
                # join): the entry says what they are, and this rank sends zeros.
                zeros = {z.name: z for z in entry.zeros if z is not None}
                if entry.assign:
                    sigs = {n: self._inflight[n].sig for n in entry.assign if n in self._inflight}
                    sigs.update({n: zeros[n].signature() for n in entry.assign
                                 if n not in sigs and n in zeros})
                    self.cache.learn({n: i for n, i in entry.assign.items() if n in sigs}, sigs)
                group = []
                for i, ref in enumerate(entry.tensors):
                    z = entry.zeros[i] if entry.zeros else None
                    name = z.name if z is not None else self.cache.resolve(ref)
                    t = self._inflight.get(name)
                    if t is None and (z is not None or entry.error):
                        self._skip_auto_name(name)
                    if t is None and z is not None and not entry.error:
                        t = _zero_tensor(name, z)
                    group.append(t)
                if None in group:
                    if self._failure is not None or entry.error:
                        # failed locally meanwhile; or an error for tensors that only
                        # the other ranks submitted while this rank was joined
                        continue
                    raise NetReduceError(f"coordinator log entry {entry.seq} names a tensor "
                                         "this rank never submitted (protocol bug)")
                for t in group:  # under the lock: _fail must see them as negotiated
                    t.seq = entry.seq
                if entry.last >= 0:
                    group[0].output[...] = entry.last  # join(): the rank that joined last
            for t in group:
                if self.timeline:
                    self.timeline.span(t.name, "wait_for_ranks", t.t_sent, now)
            if entry.error:
                self.complete(group, NegotiationError(entry.error))
            else:
                self._exec_q.put((entry.seq, group))
        for stall in reply.stalls:
            self._missing[stall.name] = list(stall.missing)
            if self.stall_s > self._stall_req_s:
                continue  # reported early for the timeout's error; not a warning yet
            log.warning("netreduce rank %d: tensor '%s' has waited %.0f s for rank(s) %s, which "
                        "have not submitted it (stalled ranks, or a name only some ranks use)",
                        self.rank, stall.name, stall.age or self.stall_s,
                        ", ".join(map(str, stall.missing)))
        if reply.failure is not None:
            self._fail_from(reply.failure)
        elif self._failure is not None:
            self._fail(self._failure, self._fail_after, abort=False)  # caught up yet?

    def _skip_auto_name(self, name: str) -> None:
        """A joined rank sees the others' collectives go by: keep its counters of
        auto-generated names ("allreduce.noname.7") in step with theirs, so that
        unnamed calls still pair up across ranks after the join."""
        m = _AUTO_NAME.match(name)
        if m:
            kind, n = m.group(1), int(m.group(2))
            if self.name_counters.get(kind, 0) <= n:
                self.name_counters[kind] = n + 1

    # --- negotiation timeout (netreduce/worker/unmatched.py) -------------------------------
    def _unmatched(self) -> List[Tensor]:
        """Tensors that may reach the negotiation timeout (none once failed)."""
        with self._lock:
            if self._failure is not None:
                return []
            return unmatched.waiting(self._inflight.values(), self._last_reply_us)

    def _next_deadline(self) -> Optional[float]:
        return unmatched.next_deadline(self._unmatched(), self.timeout_s)

    def _expire_unmatched(self) -> bool:
        now_us = tl.now_us()
        t = unmatched.expired(self._unmatched(), now_us, self.timeout_s)
        if t is None:
            return False
        self.report_failure(unmatched.error(t, self._missing.get(t.name), self.rank, self.job,
                                            self.timeout_s))
        return True

    # --- failure ---------------------------------------------------------------------
    def _watch_loop(self) -> None:
        try:
            reply = self.neg.watch()
        except (NetReduceError, OSError, ValueError) as exc:
            if not self._stopping:  # our own shutdown closes the connection
                self._fail(exc if isinstance(exc, NetReduceError) else
                           operation_errors.watch_lost(self.address, exc), None, abort=True)
            return
        if reply.failure is not None and not self._stopping:
            self._fail_from(reply.failure)

    def _fail_from(self, f: Failure) -> None:
        """The coordinator reported the job failed."""
        self._fail(RankFailedError(f.message, f.rank), f.after, abort=True, reported=True)

    def _fail(self, error: NetReduceError, after: Optional[int], abort: bool,
              reported: bool = False) -> None:
        """Record the first failure; fail what can no longer complete.

        A rank that left cleanly (``after`` = the last log entry it executed) may have
        completed entries that this rank has not read yet — a final barrier, say,
        whose reply is still in our socket while the watch reports the departure.
        Those must still run, so tensors without an entry fail only once this rank
        has read the log past ``after``; _on_reply calls back here as it reads."""
        with self._lock:
            if self._failure is None:
                self._reported = reported  # before _failure: error_for reads them unlocked
                self._failure, self._fail_after = error, after
            error, after = self._failure, self._fail_after
            caught_up = after is None or self.neg.next_seq > after
            doomed = [t for t in self._inflight.values() if t.seq < 0] if caught_up else []
            if caught_up:
                self._new = []
            running = self._executing
            if running is None and self._flying():
                running = GROUP_SEQ  # agreed groups on the wire behind the executor
        if not caught_up:
            os.write(self._wake_w, b"x")  # the negotiation thread polls for the rest
        self.complete(doomed, error)
        if (abort or running == ROUND_SEQ) and running is not None and \
                (after is None or running > after):
            if after is None:
                # Died unannounced: it may have contributed to the running entry just
                # before dying (its results are then already on their way here), so
                # the transfer gets a moment to finish before it is cut.
                timer = threading.Timer(ABORT_GRACE_S, self._abort_if_running, (running, error))
                timer.daemon = True
                timer.start()
            else:
                self._abort_if_running(running, error)

    def _abort_if_running(self, seq: int, error: NetReduceError) -> None:
        with self._lock:
            if self._executing != seq and not (seq == GROUP_SEQ and self._flying()):
                return  # it finished meanwhile
        try:
            self.dp.abort(str(error))
        except Exception:  # already closed: nothing left to unblock
            pass

    def _flying(self) -> bool:
        """Whether agreed groups' messages are on the wire while the executor goes
        on (worker/pipeline.py): a failure aborts them as it aborts a running group."""
        return self.agreement is not None and self.agreement.pipeline.flying()

    def complete(self, tensors: List[Tensor], error: Optional[BaseException] = None) -> None:
        """Finish each tensor exactly once (failure paths may race with the executor);
        identity, not name, decides: the name may already belong to a resubmission."""
        finished = []
        with self._lock:
            for t in tensors:
                if self._inflight.get(t.name) is t:
                    del self._inflight[t.name]
                    finished.append(t)
        named = error is not None and error is self._failure and self._reported
        for t in finished:
            t.handle._finish_one(self.error_for([t.name]) if named else error)

    # --- executor thread ---------------------------------------------------------------
    def _execute_loop(self) -> None:
        if self.agreement is not None:
            self.agreement.loop()  # rounds between the groups (agreement.py)
            return
        while True:
            item = self._exec_q.get()
            if item is None:
                return
            self.run_group(*item)

    def run_group(self, seq: int, group: List[Tensor]) -> None:
        """Execute one group: a log entry's (seq >= 0) or one agreed by a round (-1)."""
        with self._lock:
            failure, after = self._failure, self._fail_after
            runnable = failure is None or (after is not None and seq <= after)
            if runnable:
                self._executing = seq
        if not runnable:
            self.complete(group, failure)
            return
        try:
            group_message.run(self, group)
            self.complete(group)
        except Exception as exc:
            self.fail_group(group, exc)
        finally:
            with self._lock:
                self._executing = None
                self._done_seq = max(self._done_seq, seq)
            self.groups_executed += 1

    def fail_group(self, tensors: List[Tensor], exc: Exception) -> None:
        """A group's data-plane message failed here (on the executor, or landing
        behind it: worker/pipeline.py): complete ``tensors`` with the job's failure
        if one came meanwhile (a peer's death: the cause, named by the coordinator),
        else with this rank's own error naming the tensors, and report it."""
        names = [t.name for t in tensors]
        if not isinstance(exc, NetReduceError):
            # A bug, not the data plane: the other ranks ran (or wait in) this message,
            # so this rank is out of step with them from here on: fatal for the job.
            log.error("netreduce failed to reduce %s", names, exc_info=exc)
            error = operation_errors.reducing_bug(self.rank, names, exc)
            self.complete(tensors, error)
            self.report_failure(error)
            return
        with self._lock:
            remote = self._failure
        if remote is not None:
            self.complete(tensors, remote)
            return
        # Our own data plane failed: say which tensors, keeping the aggregator / job /
        # slot text that says where.
        error = operation_errors.reducing_failed(self.rank, names, exc)
        self.complete(tensors, error)
        self.report_failure(error)

    def report_failure(self, exc: NetReduceError) -> None:
        # Our data plane broke (timeout, aggregator gone): tell the others so that
        # they fail now rather than at their own timeout, then fail ourselves.
        try:
            self.neg.abort(str(exc))
        except NetReduceError:
            pass
        self._fail(exc, None, abort=False)

    # --- the state its helpers see (agreement.py, speculation.py) ---------------------
    # They run the executor's messages between the groups (rounds, speculative steps)
    # and hand tensors back; these methods are all they touch of the communicator's
    # state (tests/unit/test_communicator_interface.py keeps it so).
    def failure(self) -> Optional[NetReduceError]:
        """The job's first failure (None while it runs)."""
        return self._failure

    def error_for(self, names: Sequence[str]) -> Optional[NetReduceError]:
        """The error an operation on tensors ``names`` gets from the job's failure
        (None while the job runs), a fresh instance each time. A failure the
        coordinator reported (another rank left or died) is the same text on every
        rank, busy or not: the error says which operation here it stopped, on which
        rank of which job, through which aggregator, keeping RankFailedError and its
        ``rank`` (operation_errors.py). This rank's own failures already say what
        failed: a copy. Unlocked: _failure is read before _reported, which _fail sets
        first."""
        return operation_errors.for_operation(self._failure, self._reported, self.rank,
                                              self.job, self.address, names)

    def busy(self) -> bool:
        """Whether any tensor of this rank is in flight (unlocked: a hint)."""
        return bool(self._inflight)

    def running(self) -> Optional[int]:
        """The log entry the executor runs (ROUND_SEQ: an agreement's own message),
        None between them."""
        return self._executing

    def begin_message(self) -> bool:
        """The executor starts an agreement's own data-plane message: a failure from
        here on aborts the data plane under it (_fail). False once the job failed."""
        self._lock.acquire()    # (not `with`: see claim)
        try:
            if self._failure is not None:
                return False
            self._executing = ROUND_SEQ
            return True
        finally:
            self._lock.release()

    def end_message(self) -> None:
        self._lock.acquire()
        try:
            self._executing = None
        finally:
            self._lock.release()

    def renegotiate(self, tensors: List[Tensor]) -> None:
        """Tensors an agreement gave up on go to the coordinator, as if just submitted
        (the negotiation thread sends them); those a failure completed meanwhile stay
        done."""
        with self._lock:
            for t in tensors:
                if self._inflight.get(t.name) is t:
                    t.seq = -1
                    self._new.append(t)
        os.write(self._wake_w, b"x")

    def claim(self, name: str) -> bool:
        """A steady step of ``name`` runs on the caller's thread with no Tensor
        (Agreement.steady): ``name`` is in flight, so a second submission of it is
        refused meanwhile, as for any other, and its message begins (begin_message: a
        failure from here on aborts the data plane under it). False, claiming nothing,
        when the job failed or stops or ``name`` is in flight already: the caller then
        takes the usual path, which raises the reason. One hold of the lock for both:
        a steady step comes here once per step."""
        # acquire/release, not `with`: a `with` binds __enter__ and __exit__ anew, ~0.5 µs
        # more per hold on the AMD boot.
        self._lock.acquire()
        try:
            if self._failure is not None or self._stopping or name in self._inflight:
                return False
            self._inflight[name] = _CLAIMED
            self._executing = ROUND_SEQ
            return True
        finally:
            self._lock.release()

    def unclaim(self, name: str, tensor: Optional[Tensor] = None) -> None:
        """The claimed step of ``name`` is over, its message ended (end_message);
        ``tensor``: what it became instead, a submission still waiting (its message did
        not complete it). A failure recorded meanwhile fails that one as it failed the
        others in flight."""
        self._lock.acquire()    # (not `with`: see claim)
        try:
            self._executing = None
            if self._inflight.get(name) is not _CLAIMED:
                return
            if tensor is None:
                del self._inflight[name]
                return
            self._inflight[name] = tensor
            failure, after = self._failure, self._fail_after
        finally:
            self._lock.release()
        if failure is not None:
            self._fail(failure, after, abort=False)

    # --- shutdown -------------------------------------------------------------------

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop negotiating, run the groups already agreed (the other ranks run them
        too), fail what was still being negotiated, say goodbye, release everything."""
        with self._lock:
            self._stopping = True
        os.write(self._wake_w, b"x")
        self._neg_thread.join(timeout)
        with self._lock:
            doomed = [t for t in self._inflight.values() if t.seq < 0]
        for t in doomed:
            self.complete([t], operation_errors.shut_down_in_negotiation(self.rank, self.job,
                                                                         t.name))
        self._exec_q.put(None)
        self._exec_thread.join(timeout)
        if self._exec_thread.is_alive():
            # Still inside the data plane (a peer that never answers): fail that call
            # so the thread leaves native code before the interpreter exits.
            self.dp.abort(f"rank {self.rank} of job '{self.job}' is shutting down")
            self._exec_thread.join(5.0)
        try:
            self.neg.bye(self._done_seq)
        except NetReduceError:
            pass  # the aggregator is gone; nobody is left to tell
        self.neg.close()
        self._watch_thread.join(timeout)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        if self.timeline:
            self.timeline.close()
