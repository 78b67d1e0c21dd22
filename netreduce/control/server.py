"""The aggregator's control port: a threaded TCP server speaking JSON lines.

One thread per connection, so a handler may block (a barrier, a negotiation round
waiting for ranks). Built-in commands: ``register`` (job admission and rank
check-in, with the path MTU the rank sees), ``payload`` (wait until the job's
payload is fixed: netreduce.control.payload), ``release``, ``counters``. Other modules add commands with
``register_handler`` and learn of closed connections (a rank that died or shut
down) with ``register_disconnect_hook``; ``netreduce.control.negotiation`` does so
at import time."""
from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import socket
import socketserver
import threading
from typing import Any, Callable, Dict, List, Optional

from netreduce.control.address import family_of, format_address, parse_address, unmap
from netreduce.control.auth import AuthError, Guard
from netreduce.control.limits import Limits, PendingConnections
from netreduce.control.payload import JobPayload, views_of

log = logging.getLogger("netreduce.switch")
# How long the last rank's register waits for the earlier ranks to be told the payload.
INFORM_WAIT_S = 5.0


class RequestError(Exception):
    """Raised by a handler: answered as ok=false with this message."""


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
    # Ranks that will ask for the final payload (register said await_payload) and
    # those that have been answered: the last rank's register returns only once the
    # others have their answer, so data never waits on a control round trip.
    awaiting: set = dataclasses.field(default_factory=set)
    informed: set = dataclasses.field(default_factory=set)


class Session:
    """One control connection. ``job``/``rank`` are set once it registered."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.job: Optional[str] = None
        self.rank: Optional[int] = None
        self.record: Optional[JobRecord] = None  # the run of the job it registered in
        self.state: Dict[str, Any] = {}


Handler = Callable[["ControlServer", Session, Dict[str, Any]], Dict[str, Any]]
DisconnectHook = Callable[["ControlServer", Session], None]
HANDLERS: Dict[str, Handler] = {}
DISCONNECT_HOOKS: List[DisconnectHook] = []


def register_handler(cmd: str, fn: Handler) -> None:
    HANDLERS[cmd] = fn


def register_disconnect_hook(fn: DisconnectHook) -> None:
    DISCONNECT_HOOKS.append(fn)


class ControlServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Every rank opens several control connections at start-up; socketserver's default
    # backlog of 5 would drop some of a large job's and cost each a 1 s SYN retry.
    request_queue_size = 1024

    def __init__(self, host: str, port: int, aggregator: Any,
                 payload_explicit: bool = False, guard: Optional[Guard] = None,
                 limits: Optional[Limits] = None) -> None:
        self.aggregator = aggregator
        # Job secrets and the operator's secret (netreduce/control/auth.py); the
        # limits that keep hostile connections from growing memory or threads.
        self.guard = guard or Guard()
        self.limits = limits or Limits()
        self.pending = PendingConnections(self.limits.max_pending)
        # aggregator.payload_bytes is the cap: --payload-bytes when given, else the
        # wire's largest; each job's own payload follows its ranks' paths.
        self.payload_explicit = payload_explicit
        self.lock = threading.Lock()
        self.payload_fixed = threading.Condition(self.lock)
        self.jobs: Dict[str, JobRecord] = {}
        self.address_family = family_of(host)  # IPv6 hosts; "::" serves both families
        super().__init__((host, port), _ConnectionHandler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:  # "::": IPv4 ranks too, as the UDP ports
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    # -- built-in commands ----------------------------------------------------
    def register(self, sess: Session, msg: Dict[str, Any]) -> Dict[str, Any]:
        name, rank, size = str(msg["job"]), int(msg["rank"]), int(msg["size"])
        if not 0 <= rank < size:
            raise RequestError(f"job '{name}': rank {rank} out of range for world size {size}")
        if sess.record is not None:  # its release would free only the last one
            raise RequestError(f"job '{name}' (rank {rank}): this connection already registered "
                               f"rank {sess.rank} of job '{sess.job}'; one rank per connection")
        self.admit(sess, name, rank, msg)
        views = self._path_views(sess, rank, msg)
        with self.lock:
            job = self.jobs.get(name)
            if job is not None and job.closing:
                job = None  # the old run stays alive for its own ranks until they leave
            if job is None:
                key = secrets.randbits(32)
                plan = JobPayload(int(self.aggregator.payload_bytes), self.payload_explicit)
                plan.add(views)
                try:
                    payload, reason = plan.choose()
                    index = self.aggregator.add_job(size, key, payload)
                except Exception as exc:  # refused: max jobs or memory limit
                    raise RequestError(f"job '{name}' (rank {rank}) refused: {exc}") from None
                deterministic = bool(msg.get("deterministic", False))
                if deterministic:
                    self._make_ordered(index, name, rank)
                job = JobRecord(name, size, index, key, plan=plan, payload_bytes=payload,
                                payload_reason=reason, deterministic=deterministic,
                                deterministic_by=rank)
                self.jobs[name] = job
                log.info("job '%s' admitted: index %d, world size %d", name, index, size)
                views = []
            elif job.size != size:
                raise RequestError(
                    f"job '{name}': rank {rank} says world size {size}, but the job was "
                    f"registered with world size {job.size}")
            elif bool(msg.get("deterministic", False)) != job.deterministic:
                mine, theirs = int(not job.deterministic), int(job.deterministic)
                raise RequestError(
                    f"job '{name}': rank {rank} has NETREDUCE_DETERMINISTIC={mine}, but rank "
                    f"{job.deterministic_by} admitted the job with NETREDUCE_DETERMINISTIC="
                    f"{theirs}; set it the same on every rank")
            if rank in job.ranks:
                raise RequestError(
                    f"job '{name}': rank {rank} is already registered (from {job.ranks[rank].peer})")
            self._settle_payload(job, views, name, rank)
            job.ranks[rank] = sess
            sess.job, sess.rank, sess.record = name, rank, job
            if len(job.ranks) == job.size:
                job.payload_final = True
                self.payload_fixed.notify_all()
                log.info("job '%s': %s", name, job.payload_reason)
                self.payload_fixed.wait_for(
                    lambda: job.awaiting <= job.informed or job.closing, timeout=INFORM_WAIT_S)
            elif msg.get("await_payload"):
                job.awaiting.add(rank)
            final = job.payload_final
            missing = sorted(set(range(job.size)) - set(job.ranks))
        agg = self.aggregator
        group, group_port = agg.group(job.index)
        return {"job_index": job.index, "key": job.key, "slots": agg.slots,
                "payload_bytes": job.payload_bytes if final else 0,
                "payload_reason": job.payload_reason if final else "", "missing": missing,
                "data_port": agg.port, "threads": agg.threads, "deterministic": job.deterministic,
                "group": group, "group_port": group_port}

    def _make_ordered(self, index: int, name: str, rank: int) -> None:
        """The new job's slots fold in rank order (NETREDUCE_DETERMINISTIC); refused
        (memory), the job is removed again so that the refusal leaves nothing behind."""
        try:
            self.aggregator.set_job_ordered(index)
        except Exception as exc:
            self.aggregator.remove_job(index)
            raise RequestError(f"job '{name}' (rank {rank}) refused: {exc}") from None

    def _path_views(self, sess: Session, rank: int, msg: Dict[str, Any]) -> List[Any]:
        """The rank's own report of its path MTU and the aggregator's route back."""
        from netreduce import _native
        peer_ip = parse_address(sess.peer, what="the rank's control connection")[0]
        reported = None
        if msg.get("mtu"):
            reported = (int(msg["mtu"]), bool(msg.get("ipv6", False)))
        try:
            own = tuple(_native.path_mtu(peer_ip, self.aggregator.port))
        except Exception as exc:  # no route back: the data plane will say so
            log.warning("no path MTU toward %s (rank %d): %s", peer_ip, rank, exc)
            own = None
        return views_of(rank, str(msg.get("host", "")), peer_ip, reported, own,
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
            if sess.record is not None:
                sess.record.informed.add(sess.rank)
                self.payload_fixed.notify_all()

    def wait_payload(self, sess: Session, msg: Dict[str, Any]) -> Dict[str, Any]:
        """The job's payload once every rank has registered; payload_bytes 0 and the
        ranks still missing when ``wait`` seconds (at most 5) pass first."""
        job = sess.record
        if job is None:
            raise RequestError("'payload' before 'register' on this connection")
        wait = max(0.0, min(float(msg.get("wait", 0.0)), 5.0))
        with self.payload_fixed:
            self.payload_fixed.wait_for(lambda: job.payload_final or job.closing, timeout=wait)
            if not job.payload_final and job.closing:
                raise RequestError(f"job '{job.name}': a rank left before every rank had "
                                   "registered; this run of the job is over")
            missing = sorted(set(range(job.size)) - set(job.ranks))
            return {"payload_bytes": job.payload_bytes if job.payload_final else 0,
                    "payload_reason": job.payload_reason, "missing": missing}

    def release(self, sess: Session) -> None:
        """Drop the session's rank from its job; the last rank out frees the pool."""
        with self.lock:
            job = sess.record
            if job is None or job.ranks.get(sess.rank) is not sess:
                return
            del job.ranks[sess.rank]
            job.closing = True
            self.payload_fixed.notify_all()
            if not job.ranks:
                if self.jobs.get(job.name) is job:
                    del self.jobs[job.name]
                self.aggregator.remove_job(job.index)
                log.info("job '%s' finished: pool %d freed", job.name, job.index)

    def admit(self, sess: Session, job: str, rank: int, msg: Dict[str, Any]) -> None:
        """The job-secret check of a request that binds ``sess`` to ``job``."""
        try:
            self.guard.admit(sess, job, rank, msg)
        except AuthError as exc:
            raise RequestError(str(exc)) from None
        self.pending.settle(sess)

    def counters(self, sess: Optional[Session] = None,
                 msg: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Global counters and those of the jobs ``sess`` may read: its own job, open
        jobs (admitted without a secret), or all of them for the operator (and for
        the daemon itself: ``sess`` None)."""
        msg = msg or {}
        if sess is not None:
            try:
                if self.guard.operator(sess, msg):
                    self.pending.settle(sess)
                elif msg.get("job") is not None:  # a reader proving one job's secret
                    self.admit(sess, str(msg["job"]), int(msg.get("rank", -1)), msg)
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
            try:
                c = dict(self.aggregator.job_counters(job.index))
            except ValueError:
                continue  # removed meanwhile
            c.update(index=job.index, size=job.size, ranks=sorted(job.ranks),
                     payload_bytes=job.payload_bytes,
                     payload_reason=job.payload_reason if job.payload_final else
                     f"pending until every rank has registered ({job.payload_reason})")
            jobs[job.name] = c
        return {"global": dict(self.aggregator.counters()), "jobs": jobs, "hidden_jobs": hidden}


class _ConnectionHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        srv: ControlServer = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # "10.0.0.3:5501" or "[fd00::3]:5501"; an IPv4 rank on a dual-stack port as IPv4
        sess = Session(format_address((unmap(self.client_address[0]), self.client_address[1])))
        srv.pending.add(sess, sock)
        limits = srv.limits
        try:
            while True:
                # Until the connection belongs to a job (or the operator): short lines,
                # and silence closes it; then requests of any size up to line_bytes.
                bound = srv.pending.is_settled(sess)
                limit = limits.line_bytes if bound else limits.pending_line_bytes
                sock.settimeout(None if bound else limits.pending_idle_s)
                try:
                    line = self.rfile.readline(limit + 1)
                except socket.timeout:
                    log.debug("%s: silent for %.0f s before binding to a job: closed",
                              sess.peer, limits.pending_idle_s)
                    break
                if not line:
                    break
                if len(line) > limit:
                    self._send({"ok": False, "error": f"request longer than {limit} bytes "
                                "(the control port's limit); closing the connection"})
                    break
                msg, reply = _answer(srv, sess, line)
                self._send(reply)
                if reply.get("payload_bytes") and msg.get("cmd") == "payload":
                    srv.payload_delivered(sess)
        except (ConnectionError, OSError, ValueError):
            pass  # reset, evicted (shut down by PendingConnections) or closed meanwhile
        finally:
            srv.pending.discard(sess)
            for hook in DISCONNECT_HOOKS:
                try:
                    hook(srv, sess)
                except Exception:  # a hook's bug must not take the daemon down
                    log.exception("disconnect hook failed")
            srv.release(sess)
            srv.guard.unbind(sess)

    def _send(self, reply: Dict[str, Any]) -> None:
        self.request.settimeout(None)
        self.wfile.write((json.dumps(reply, separators=(",", ":")) + "\n").encode())
        self.wfile.flush()

    @staticmethod
    def _dispatch(srv: ControlServer, sess: Session, msg: Dict[str, Any]) -> Dict[str, Any]:
        cmd = msg.get("cmd")
        if cmd == "challenge":
            return srv.guard.challenge(sess)
        if cmd == "register":
            return srv.register(sess, msg)
        if cmd == "payload":
            return srv.wait_payload(sess, msg)
        if cmd == "release":
            srv.release(sess)
            return {}
        if cmd == "counters":
            return srv.counters(sess, msg)
        if cmd == "ping":
            return {}
        handler = HANDLERS.get(cmd)
        if handler is None:
            raise RequestError(f"unknown command {cmd!r}")
        return handler(srv, sess, msg)


def _answer(srv: ControlServer, sess: Session, line: bytes) -> "tuple[Dict[str, Any], Dict[str, Any]]":
    """One request line -> (the request, its reply). Hostile input (not JSON, not an
    object, absurd values, nesting deep enough to exhaust the parser) is answered
    with ok=false, never an exception: fuzz/control_fuzzer.py drives this."""
    msg: Any = {}
    try:
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise TypeError(f"a request is a JSON object, not {type(msg).__name__}")
        return msg, dict(_ConnectionHandler._dispatch(srv, sess, msg), ok=True)
    except RequestError as exc:
        return msg if isinstance(msg, dict) else {}, {"ok": False, "error": str(exc)}
    except (KeyError, TypeError, ValueError, ArithmeticError, RecursionError) as exc:
        return ({} if not isinstance(msg, dict) else msg,
                {"ok": False, "error": f"malformed request {line[:200]!r}: {exc!r}"})


# Commands of their own modules (registered on import).
from netreduce.control import verbs as _verbs  # noqa: E402,F401  verbs_connect
