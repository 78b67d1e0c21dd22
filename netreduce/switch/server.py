"""The aggregator's control port: a TCP server speaking the control protocol
(netreduce/protocol/messages.py: one JSON object per line, every request and reply
a declared type, a protocol version exchanged first on every connection).

All connections are served by one event-loop thread (netreduce/switch/loop.py); a
handler that has to wait (a hello for the other ranks, a long-poll) returns a
``Wait`` (switch/waits.py) instead of blocking. Built-in commands: ``register``
(job admission and rank check-in, with the path MTU the rank sees), ``payload``
(wait until the job's payload is fixed: netreduce.switch.payload), ``release``,
``counters``, and ``verbs_connect`` (switch/verbs.py). Other modules add commands
with ``register_handler`` (switch/commands.py, by request type; blocking ones run on a
thread pool)
and learn of closed connections (a rank that died or shut down) with
``register_disconnect_hook``; ``netreduce.switch.coordinator`` does so at import
time."""
from __future__ import annotations

import dataclasses
import logging
import secrets
import socket
import threading
import time
from typing import Any, Dict, List, Optional

from netreduce.errors import NetReduceError
from netreduce.protocol import codec, messages
from netreduce.protocol import data_address
from netreduce.protocol.address import family_of, format_address, parse_address, unmap
from netreduce.protocol.auth import AuthError, Guard
from netreduce.switch import dispatch, epochs, fanout, pending, window
from netreduce.switch.finished import FinishedJobs
from netreduce.switch import verbs  # noqa: F401  registers verbs_connect, a built-in to every server
from netreduce.switch.commands import (DISCONNECT_HOOKS, HANDLERS, INLINE, JOB_FAILURE_HOOKS,
                                       RequestError)
from netreduce.switch.limits import Limits, PendingConnections
from netreduce.switch.loop import Conn, EventLoop
from netreduce.switch.payload import JobPayload, views_of
from netreduce.switch.waits import Topic, Wait, resolve

log = logging.getLogger("netreduce.switch")
# How long the last rank's register waits for the earlier ranks to be told the payload.
INFORM_WAIT_S = 5.0


@dataclasses.dataclass
class JobRecord:
    name: str
    size: int
    index: int
    key: int
    ranks: Dict[int, "Session"] = dataclasses.field(default_factory=dict)
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)
    # A rank has left: this run of the job is ending. A rank that registers now
    # (one that shut down and called init() again) starts the next run in a pool of
    # its own, so that its packets never meet this run's slot state.
    closing: bool = False
    # The pool's payload: provisional (the views so far) until every rank has
    # registered, then final; why says which path decided it.
    plan: Optional[JobPayload] = None
    payload_bytes: int = 0
    payload_reason: str = ""
    payload_final: bool = False
    # NETREDUCE_DETERMINISTIC as the first rank asked: every rank must agree.
    deterministic: bool = False
    deterministic_by: int = 0
    # NETREDUCE_WINDOW as the first rank to say it asked (None: none said; 0 = all
    # slots): a chunk's slot is its sequence number mod the window, so ranks with
    # different windows would add chunks of different offsets in one slot.
    window: Optional[int] = None
    window_by: int = 0
    # The smallest receive buffer ranks reported (SO_RCVBUF read back), by whether
    # their sockets coalesce: {coalesced: (bytes, rank)}; and the window the job then
    # runs with, fixed with the payload (0: all slots).
    receive_buffers: Dict[bool, Any] = dataclasses.field(default_factory=dict)
    window_fit: int = 0
    # Ranks that will ask for the final payload (register said await_payload) and
    # those that have been answered: the last rank's register returns only once the
    # others have their answer, so data never waits on a control round trip.
    awaiting: set = dataclasses.field(default_factory=set)
    informed: set = dataclasses.field(default_factory=set)
    # The membership epoch of an elastic job (0: not elastic): a register naming a
    # later epoch ends this run and starts the job's next one at its own world size
    # (switch/epochs.py); one naming an earlier epoch is refused.
    epoch: int = 0
    resizes: int = 0  # runs of this name that a later epoch replaced, this one's included
    # --fanout segment: why the job's results go to its multicast group, or why not
    # (switch/fanout.py), decided with the final payload.
    fanout_reason: str = ""
    verbs_rank: Optional[int] = None  # a rank on the verbs transport (none: None)
    # This run cannot go on (a rank registered with another world size, no room
    # when it completed, its ranks did not all come in time): every rank still
    # waiting for the job hears why at once.
    failure: str = ""
    # Who registered its first rank, and when (monotonic): a job whose ranks have not
    # all registered is pending, bounded per source and dropped after a while.
    source: str = ""
    created: float = 0.0


class _JobFailed(NetReduceError):
    """Raised under the server's lock; its hooks run once the lock is released."""


class Session:
    """One control connection. ``job``/``rank`` are set once it registered."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.version: Optional[int] = None  # the client's protocol, once it said hello
        self.job: Optional[str] = None
        self.rank: Optional[int] = None
        self.record: Optional[JobRecord] = None  # the run of the job it registered in
        self.state: Dict[str, Any] = {}
        self.conn: Any = None  # the event loop's connection (switch/loop.py)


class ControlServer:
    # A large job's ranks connect at once: a short backlog drops SYNs, each a 1 s retry.
    request_queue_size = 4096

    def __init__(self, host: str, port: int, aggregator: Any,
                 payload_explicit: bool = False, guard: Optional[Guard] = None,
                 limits: Optional[Limits] = None, tls: Optional[Any] = None) -> None:
        self.aggregator = aggregator
        # Job secrets and the operator's secret (netreduce/protocol/auth.py); the
        # limits that keep hostile connections from growing memory or threads.
        self.guard = guard or Guard()
        self.limits = limits or Limits()
        self.pending = PendingConnections(self.limits.max_pending)
        # aggregator.payload_bytes is the cap: --payload-bytes when given, else the
        # wire's largest; each job's own payload follows its ranks' paths.
        self.payload_explicit = payload_explicit
        self.lock = threading.Lock()
        self.payload_fixed = threading.Condition(self.lock)
        self.payload_topic = Topic(self.payload_fixed)
        self.jobs: Dict[str, JobRecord] = {}
        # Runs holding a pool, by id: admitted (every rank registered; what --max-jobs
        # counts) and pending (not yet: bounded by the limits' pending_* on their own).
        self.admitted: Dict[int, JobRecord] = {}
        self.pending_jobs: Dict[int, JobRecord] = {}
        self.refused = {"max_jobs": 0, "pending": 0}  # refusals decided here, not natively
        self.closing_later: List[Any] = []  # (monotonic deadline, conn) of dropped jobs' ranks
        self.finished = FinishedJobs(self.limits.finished_job_s)  # last counters, a while
        self.max_jobs = self.limits.max_jobs if self.limits.max_jobs is not None else \
            (int(aggregator.counters()["jobs_max"]) if aggregator is not None else 0)
        family = family_of(host)  # IPv6 hosts; "::" serves IPv4 ranks too, as the UDP ports
        self.socket = socket.create_server((host, port), family=family,
                                           backlog=self.request_queue_size,
                                           dualstack_ipv6=family == socket.AF_INET6
                                           and host == "::" and socket.has_dualstack_ipv6())
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()[:2]
        self.loop = EventLoop(self, self.socket, tls)  # tls: an ssl.SSLContext (--tls-cert)
        self._serving = threading.Event()

    # -- serving (socketserver's names, which the daemon and tests use) -------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until shutdown(); connections stay served after it (a draining
        daemon still answers its jobs) until the process ends."""
        self.loop.start()
        while not self._serving.wait(poll_interval):
            pass

    def shutdown(self) -> None:
        """Accept no new connection; serve_forever returns."""
        self.loop.stop_accepting()
        self._serving.set()

    def server_close(self) -> None:
        self.loop.close_listener()

    # -- the loop's callbacks ------------------------------------------------------
    def new_session(self, addr: Any) -> "Session":
        # "10.0.0.3:5501" or "[fd00::3]:5501"; an IPv4 rank on a dual-stack port as IPv4
        return Session(format_address((unmap(addr[0]), addr[1])))

    def opened(self, sess: "Session", sock: socket.socket) -> None:
        self.pending.add(sess, sock)

    def bound(self, sess: "Session") -> bool:
        return self.pending.is_settled(sess)

    def limit_of(self, sess: "Session") -> int:
        return self.limits.line_bytes if self.bound(sess) else self.limits.pending_line_bytes

    def closed(self, sess: "Session") -> None:
        sess.conn = None
        self.pending.discard(sess)
        for hook in DISCONNECT_HOOKS:
            try:
                hook(self, sess)
            except Exception:  # a hook's bug must not take the daemon down
                log.exception("disconnect hook failed")
        self.release(sess)
        self.guard.unbind(sess)

    def begin(self, loop: EventLoop, conn: Conn, line: bytes) -> None:
        """One request line: answered now, parked as a Wait, or run on the pool."""
        sess = conn.sess
        try:
            msg = codec.decode_request(line)
        except codec.ProtocolError as exc:  # names the command and the field
            loop.send(conn, codec.encode_error(str(exc), exc.rid))
            return
        if sess.version is None or isinstance(msg, messages.Hello):
            reply, agreed = dispatch.greet(sess, msg)
            loop.send(conn, reply)
            if not agreed:  # another protocol: nothing more can be understood
                loop.close_after_write(conn)
            return
        rid = msg.id
        sequential = rid is None
        conn.busy = conn.busy or sequential

        def answer(result: Optional[messages.Reply], error: Optional[BaseException]) -> None:
            loop.send(conn, dispatch.reply_line(msg, result, error))
            if isinstance(result, messages.PayloadReply) and result.payload_bytes:
                self.payload_delivered(sess)
            loop.finished(conn, sequential)

        kind = type(msg)
        if kind in HANDLERS and kind not in INLINE:
            future = loop.pool.submit(lambda: resolve(dispatch.dispatch(self, sess, msg)))
            future.add_done_callback(lambda f: loop.call_soon(
                lambda: None if conn.closed else answer(*dispatch.outcome(f))))
            return
        try:
            result = dispatch.dispatch(self, sess, msg)
        except Exception as exc:
            answer(None, exc)
            return
        if isinstance(result, Wait):
            loop.park(conn, result, answer)
        else:
            answer(result, None)

    # -- built-in commands ----------------------------------------------------
    def register(self, sess: Session, msg: messages.Register) -> Wait:
        name, rank, size = msg.job, msg.rank, msg.size
        if not 0 <= rank < size:
            raise RequestError(f"job '{name}': rank {rank} out of range for world size {size}")
        if sess.record is not None:  # its release would free only the last one
            raise RequestError(f"job '{name}' (rank {rank}): this connection already registered "
                               f"rank {sess.rank} of job '{sess.job}'; one rank per connection")
        self.admit(sess, name, rank, msg.auth)
        source = self._data_source(sess, name, rank, msg)
        views = self._path_views(sess, rank, msg)
        try:
            return self._register(sess, msg, name, rank, size, views, source)
        except _JobFailed as exc:
            for hook in JOB_FAILURE_HOOKS:
                hook(self, name, str(exc))
            raise RequestError(str(exc)) from None

    def job_failure(self, name: str) -> str:
        """Why the current run of job ``name`` cannot go on ("" if it can)."""
        with self.lock:
            job = self.jobs.get(name)
            return job.failure if job is not None and not job.closing else ""

    def _register(self, sess: Session, msg: messages.Register, name: str, rank: int, size: int,
                  views: List[Any], source: Optional[Any]) -> Wait:
        epoch = msg.epoch  # an elastic job's membership (switch/epochs.py)
        with self.lock:
            job = self.jobs.get(name)
            past = None
            if epoch:
                job, past = epochs.settle(self, name, job, epoch, rank)
            elif job is not None and job.closing:
                job = None  # the old run stays alive for its own ranks until they leave
            if job is None:
                pending.room_for_new_job(self, sess, name, rank, size)
                key = secrets.randbits(32)
                plan = JobPayload(int(self.aggregator.payload_bytes), self.payload_explicit)
                plan.add(views)
                try:
                    payload, reason = plan.choose()
                    index = self.aggregator.add_job(size, key, payload)
                except Exception as exc:  # refused: max jobs or memory limit
                    raise RequestError(f"job '{name}' (rank {rank}) refused: {exc}") from None
                deterministic = msg.deterministic
                if deterministic:
                    self._make_ordered(index, name, rank)
                job = JobRecord(name, size, index, key, plan=plan, payload_bytes=payload,
                                payload_reason=reason, deterministic=deterministic,
                                deterministic_by=rank, epoch=epoch, source=pending.source(sess),
                                created=time.monotonic())
                self.jobs[name] = job
                self.pending_jobs[id(job)] = job
                self.finished.forget(name)  # this run's counters start again
                epochs.admitted(self, job, past)
                views = []
            elif job.size != size:
                # The job cannot start: its other ranks hear it now, not at their timeout.
                job.failure = (f"job '{name}': rank {rank} says world size {size} but the job "
                               f"was registered with {job.size}")
                self.payload_topic.notify()
                raise _JobFailed(job.failure)
            elif msg.deterministic != job.deterministic:
                mine, theirs = int(not job.deterministic), int(job.deterministic)
                raise RequestError(
                    f"job '{name}': rank {rank} has NETREDUCE_DETERMINISTIC={mine}, but rank "
                    f"{job.deterministic_by} admitted the job with NETREDUCE_DETERMINISTIC="
                    f"{theirs}; set it the same on every rank")
            window.agree(job, name, rank, msg)
            if rank in job.ranks:
                raise RequestError(
                    f"job '{name}': rank {rank} is already registered (from {job.ranks[rank].peer})")
            if len(job.ranks) + 1 == job.size and id(job) in self.pending_jobs and \
                    len(self.admitted) >= self.max_jobs:
                # Complete now, but jobs that completed meanwhile took the room.
                self.refused["max_jobs"] += 1
                job.failure = (f"job '{name}' refused when its last rank ({rank}) registered: "
                               f"aggregator full: --max-jobs {self.max_jobs} jobs already "
                               "admitted")
                self.payload_topic.notify()
                raise _JobFailed(job.failure)
            if source is not None:  # contributions from there only (protocol/data_address.py)
                try:
                    self.aggregator.bind_rank(job.index, rank, *source)
                except ValueError as exc:
                    raise RequestError(f"job '{name}' (rank {rank}): {exc}") from None
            self._settle_payload(job, views, name, rank)
            buffer, coalesced = msg.receive_buffer, msg.receive_coalesced
            seen = job.receive_buffers.get(coalesced)
            if buffer > 0 and (seen is None or buffer < seen[0]):
                job.receive_buffers[coalesced] = (buffer, rank)
            job.ranks[rank] = sess
            sess.job, sess.rank, sess.record = name, rank, job
            if msg.verbs:  # its NIC answers only its own QP: no group for the job
                job.verbs_rank = rank
            last = len(job.ranks) == job.size
            if last:
                self._choose_group(job)
                if self.pending_jobs.pop(id(job), None) is not None:
                    self.admitted[id(job)] = job  # what --max-jobs counts
                job.payload_final = True
                window.fit(self.aggregator, job)
                self.payload_topic.notify()
                log.info("job '%s': %s", name, job.payload_reason)
            elif msg.await_payload:
                job.awaiting.add(rank)
        agg = self.aggregator
        informed_by = time.monotonic() + INFORM_WAIT_S

        def grant(w: Wait) -> Optional[messages.RegisterReply]:
            # The last rank's answer waits (at most INFORM_WAIT_S) until the ranks that
            # asked for the payload have it: data never waits on a control round trip.
            if last and not (job.awaiting <= job.informed or job.closing) and \
                    time.monotonic() < informed_by:
                w.due = informed_by
                return None
            final = job.payload_final
            # The job's slots follow its payload (native SlotsFor): final with it.
            slots = int(agg.job_counters(job.index)["slots"]) if final else agg.slots
            missing, missing_count = pending.missing_ranks(job)
            return messages.RegisterReply(
                job_index=job.index, key=job.key, slots=slots,
                payload_bytes=job.payload_bytes if final else 0,
                window_fit=job.window_fit if final else 0,
                payload_reason=job.payload_reason if final else "",
                missing=missing, missing_count=missing_count,
                data_port=agg.port, threads=agg.threads, deterministic=job.deterministic,
                **self._group_grant(job))
        return Wait(self.payload_topic, grant)  # type: ignore[arg-type]

    def _group_grant(self, job: JobRecord) -> Dict[str, Any]:
        """The job's multicast group as a rank learns it with the payload (under
        --fanout segment only final with it: none before)."""
        fanout = getattr(self.aggregator, "fanout", "unicast")
        group, group_port = self.aggregator.group(job.index)
        return {"group": group, "group_port": group_port,
                "group_optional": fanout in ("auto", "segment")}

    def _choose_group(self, job: JobRecord) -> None:
        """--fanout segment: the job gets its multicast group when every rank is on
        this daemon's L2 segment (switch/fanout.py), unicast otherwise. Called with the
        lock held, as the last rank registers (before any rank has the payload, so
        before any data)."""
        if getattr(self.aggregator, "fanout", "unicast") != "segment":
            return
        peers = {parse_address(s.peer, what="the rank's control connection")[0]
                 for s in job.ranks.values()}
        why = (f"rank {job.verbs_rank} is on the verbs transport" if job.verbs_rank is not None
               else fanout.job_on_segment(sorted(peers)))
        try:
            self.aggregator.set_job_group(job.index, why is None)
        except Exception as exc:  # unicast it stays
            why = f"no group: {exc}"
        job.fanout_reason = ("multicast: every rank on this host's L2 segment" if why is None
                             else f"unicast: {why}")
        log.info("job '%s': %s", job.name, job.fanout_reason)

    @staticmethod
    def _data_source(sess: Session, name: str, rank: int,
                     msg: messages.Register) -> Optional[Any]:
        """The rank's data address (IP, port), which must be where its control
        connection comes from; None for a rank whose data goes through a rack
        aggregator (the spine hands its address to the rack: switch/uplink.py)."""
        where = f"job '{name}' (rank {rank})"
        try:
            ip, port = data_address.parse(msg.data_address, where)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        sess.state["data_address"] = (ip, port)
        if msg.rack:
            return None
        peer_ip = parse_address(sess.peer, what="the rank's control connection")[0]
        if not data_address.same_host(ip, peer_ip):
            raise RequestError(
                f"{where}: its data would come from {format_address((ip, port))}, but its "
                f"control connection comes from {peer_ip}; the aggregator takes contributions "
                "only from the address the rank registers from (both reach the aggregator's "
                "one address: a route or rule that sends UDP and TCP out of different "
                "addresses defeats that)")
        return ip, port

    def room_for_admitted(self, name: str) -> None:
        pending.room_for_admitted(self, name)

    def sweep(self, now: float) -> None:
        """The event loop's periodic call: drop pending jobs past their time."""
        pending.sweep(self, now)

    def _make_ordered(self, index: int, name: str, rank: int) -> None:
        """The new job's slots fold in rank order (NETREDUCE_DETERMINISTIC); refused
        (memory), the job is removed again so that the refusal leaves nothing behind."""
        try:
            self.aggregator.set_job_ordered(index)
        except Exception as exc:
            self.aggregator.remove_job(index)
            raise RequestError(f"job '{name}' (rank {rank}) refused: {exc}") from None

    def _path_views(self, sess: Session, rank: int, msg: messages.Register) -> List[Any]:
        """The rank's own report of its path MTU and the aggregator's route back."""
        from netreduce import _native
        peer_ip = parse_address(sess.peer, what="the rank's control connection")[0]
        reported = (msg.mtu, msg.ipv6) if msg.mtu else None
        try:
            own = tuple(_native.path_mtu(peer_ip, self.aggregator.port))
        except Exception as exc:  # no route back: the data plane will say so
            log.warning("no path MTU toward %s (rank %d): %s", peer_ip, rank, exc)
            own = None
        return views_of(rank, msg.host, peer_ip, reported, own,
                        _native.payload_for_mtu)

    def _settle_payload(self, job: JobRecord, views: List[Any], name: str, rank: int) -> None:
        """A later rank's views may lower the job's payload (never raise it): shrink the
        pool before any rank has the payload. Called with the lock held."""
        if not views or job.plan is None or job.payload_final:
            return
        job.plan.add(views)
        try:
            payload, reason = job.plan.choose()
            if payload < job.payload_bytes:
                self.aggregator.set_job_payload(job.index, payload)
        except Exception as exc:
            raise RequestError(f"job '{name}' (rank {rank}): {exc}") from None
        job.payload_bytes, job.payload_reason = payload, reason

    def payload_delivered(self, sess: Session) -> None:
        """The final payload's answer to ``sess`` has been written to its socket."""
        with self.lock:
            job = sess.record
            if job is not None:
                job.informed.add(sess.rank)
                if job.awaiting <= job.informed:  # what the last rank's grant waits for
                    self.payload_topic.notify()

    def wait_payload(self, sess: Session, msg: messages.Payload) -> Wait:
        """The job's payload once every rank has registered; payload_bytes 0 and the
        ranks still missing when ``wait`` seconds (at most 5) pass first."""
        job = sess.record
        if job is None:
            raise RequestError("'payload' before 'register' on this connection")
        wait = max(0.0, min(msg.wait, 5.0))
        deadline = time.monotonic() + wait

        def fixed(w: Wait) -> Optional[messages.PayloadReply]:
            if job.failure:
                raise RequestError(job.failure)
            if not (job.payload_final or job.closing) and time.monotonic() < deadline:
                w.due = deadline
                return None
            if not job.payload_final and job.closing:
                raise RequestError(f"job '{job.name}': a rank left before every rank had "
                                   "registered; this run of the job is over")
            missing, missing_count = pending.missing_ranks(job)
            reply = messages.PayloadReply(
                payload_bytes=job.payload_bytes if job.payload_final else 0,
                payload_reason=job.payload_reason, missing=missing, missing_count=missing_count)
            if job.payload_final:  # the slots follow the payload (native SlotsFor)
                reply.slots = int(self.aggregator.job_counters(job.index)["slots"])
                reply.window_fit = job.window_fit
                for k, v in self._group_grant(job).items():  # --fanout segment: decided now
                    setattr(reply, k, v)
            return reply
        return Wait(self.payload_topic, fixed)  # type: ignore[arg-type]

    def release_request(self, sess: Session) -> messages.Empty:
        self.release(sess)
        return messages.Empty()

    def release(self, sess: Session) -> None:
        """Drop the session's rank from its job; the last rank out frees the pool."""
        with self.lock:
            job = sess.record
            if job is None or job.ranks.get(sess.rank) is not sess:
                return
            del job.ranks[sess.rank]
            job.closing = True
            self.payload_topic.notify()
            if not job.ranks:
                if self.jobs.get(job.name) is job:
                    del self.jobs[job.name]
                self.admitted.pop(id(job), None)
                self.pending_jobs.pop(id(job), None)
                view = self._job_view(job)
                if view is not None:
                    self.finished.keep(job.name, view, self.guard.verifier(job.name))
                self.aggregator.remove_job(job.index)
                log.info("job '%s' finished: pool %d freed", job.name, job.index)

    def admit(self, sess: Session, job: str, rank: int,
              auth: Optional[messages.Auth]) -> None:
        """The job-secret check of a request that binds ``sess`` to ``job``."""
        try:
            self.guard.admit(sess, job, rank, auth)
        except AuthError as exc:
            raise RequestError(str(exc)) from None
        self.pending.settle(sess)

    def _job_view(self, job: JobRecord) -> Optional[Dict[str, Any]]:
        """One job's counters as ``counters`` shows them; None once its pool is gone."""
        try:
            c = dict(self.aggregator.job_counters(job.index))
        except ValueError:
            return None
        if job.fanout_reason:
            c["fanout_reason"] = job.fanout_reason
        c.update(index=job.index, size=job.size, ranks=sorted(job.ranks),
                 epoch=job.epoch, resizes=job.resizes,
                 payload_bytes=job.payload_bytes, window_fit=job.window_fit,
                 payload_reason=job.payload_reason if job.payload_final else
                 f"pending until every rank has registered ({job.payload_reason})")
        return c

    def counters(self, sess: Optional[Session] = None,
                 msg: Optional[messages.Counters] = None) -> Dict[str, Any]:
        """Global counters and those of the jobs ``sess`` may read: its own job, open
        jobs (admitted without a secret), or all of them for the operator (and for
        the daemon itself: ``sess`` None)."""
        msg = msg or messages.Counters()
        if sess is not None:
            try:
                if self.guard.operator(sess, msg.operator):
                    self.pending.settle(sess)
                elif msg.job is not None:  # a reader proving one job's secret
                    self.admit(sess, msg.job, msg.rank, msg.auth)
            except AuthError as exc:
                raise RequestError(str(exc)) from None
        jobs = {}
        with self.lock:
            records = list(self.jobs.values())
        hidden = 0
        for job in records:
            if sess is not None and not self.guard.may_read(sess, job.name):
                hidden += 1
                continue
            view = self._job_view(job)
            if view is not None:  # None: removed meanwhile
                jobs[job.name] = view
        live = {job.name for job in records}
        for name, view, pub in self.finished.current():  # last counters, --finished-job-s
            if name in live:
                continue  # a new run of the name is live
            if sess is not None and not self.guard.may_read_finished(sess, name, pub):
                hidden += 1
                continue
            jobs[name] = view
        g = dict(self.aggregator.counters())
        with self.lock:
            # --max-jobs counts admitted jobs; pending ones hold pools in room beside it.
            # job_resizes: elastic jobs moved to a new membership epoch (switch/epochs.py)
            g.update(jobs_max=self.max_jobs, jobs_pending=len(self.pending_jobs),
                     job_resizes=getattr(self, "epoch_moves", 0),
                     jobs_refused_pending=self.refused["pending"])
            g["jobs_refused_max_jobs"] = g.get("jobs_refused_max_jobs", 0) + \
                self.refused["max_jobs"]
            g["jobs_refused"] = g.get("jobs_refused", 0) + sum(self.refused.values())
        out = {"global": g, "jobs": jobs, "hidden_jobs": hidden,
               "fanout": getattr(self.aggregator, "fanout", "unicast")}
        if hasattr(self.aggregator, "transport_info"):  # what carries the data ports
            stats = self.aggregator.transport_stats()
            out["transport"] = dict(self.aggregator.transport_info(), port_stats=stats["ports"],
                                    program=stats.get("program", {}))
        return out
