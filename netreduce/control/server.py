"""The aggregator's control port: a threaded TCP server speaking JSON lines.

One thread per connection, so a handler may block (a barrier, a negotiation round
waiting for ranks). Built-in commands: ``register`` (job admission and rank
check-in), ``release``, ``counters``. Other modules add commands with
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

log = logging.getLogger("netreduce.switch")


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
    request_queue_size = 128

    def __init__(self, host: str, port: int, aggregator: Any) -> None:
        self.aggregator = aggregator
        self.lock = threading.Lock()
        self.jobs: Dict[str, JobRecord] = {}
        super().__init__((host, port), _ConnectionHandler)

    # -- built-in commands ----------------------------------------------------
    def register(self, sess: Session, msg: Dict[str, Any]) -> Dict[str, Any]:
        name, rank, size = str(msg["job"]), int(msg["rank"]), int(msg["size"])
        if not 0 <= rank < size:
            raise RequestError(f"job '{name}': rank {rank} out of range for world size {size}")
        with self.lock:
            job = self.jobs.get(name)
            if job is not None and job.closing:
                job = None  # the old run stays alive for its own ranks until they leave
            if job is None:
                key = secrets.randbits(32)
                try:
                    index = self.aggregator.add_job(size, key)
                except Exception as exc:  # refused: max jobs or memory limit
                    raise RequestError(f"job '{name}' (rank {rank}) refused: {exc}") from None
                job = JobRecord(name, size, index, key)
                self.jobs[name] = job
                log.info("job '%s' admitted: index %d, world size %d", name, index, size)
            elif job.size != size:
                raise RequestError(
                    f"job '{name}': rank {rank} says world size {size}, but the job was "
                    f"registered with world size {job.size}")
            if rank in job.ranks:
                raise RequestError(
                    f"job '{name}': rank {rank} is already registered (from {job.ranks[rank].peer})")
            job.ranks[rank] = sess
            sess.job, sess.rank, sess.record = name, rank, job
        agg = self.aggregator
        group, group_port = agg.group(job.index)
        return {"job_index": job.index, "key": job.key, "slots": agg.slots,
                "payload_bytes": agg.payload_bytes, "data_port": agg.port, "threads": agg.threads,
                "group": group, "group_port": group_port}

    def release(self, sess: Session) -> None:
        """Drop the session's rank from its job; the last rank out frees the pool."""
        with self.lock:
            job = sess.record
            if job is None or job.ranks.get(sess.rank) is not sess:
                return
            del job.ranks[sess.rank]
            job.closing = True
            if not job.ranks:
                if self.jobs.get(job.name) is job:
                    del self.jobs[job.name]
                self.aggregator.remove_job(job.index)
                log.info("job '%s' finished: pool %d freed", job.name, job.index)

    def counters(self) -> Dict[str, Any]:
        jobs = {}
        with self.lock:
            records = list(self.jobs.values())
        for job in records:
            try:
                c = dict(self.aggregator.job_counters(job.index))
            except ValueError:
                continue  # removed meanwhile
            c.update(index=job.index, size=job.size, ranks=sorted(job.ranks))
            jobs[job.name] = c
        return {"global": dict(self.aggregator.counters()), "jobs": jobs}


class _ConnectionHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        srv: ControlServer = self.server  # type: ignore[assignment]
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sess = Session("%s:%d" % self.client_address[:2])
        try:
            for line in self.rfile:
                try:
                    msg = json.loads(line)
                    reply = dict(self._dispatch(srv, sess, msg), ok=True)
                except RequestError as exc:
                    reply = {"ok": False, "error": str(exc)}
                except (KeyError, TypeError, ValueError) as exc:
                    reply = {"ok": False, "error": f"malformed request {line[:200]!r}: {exc!r}"}
                self.wfile.write((json.dumps(reply, separators=(",", ":")) + "\n").encode())
                self.wfile.flush()
        except (ConnectionError, OSError):
            pass
        finally:
            for hook in DISCONNECT_HOOKS:
                try:
                    hook(srv, sess)
                except Exception:  # a hook's bug must not take the daemon down
                    log.exception("disconnect hook failed")
            srv.release(sess)

    @staticmethod
    def _dispatch(srv: ControlServer, sess: Session, msg: Dict[str, Any]) -> Dict[str, Any]:
        cmd = msg.get("cmd")
        if cmd == "register":
            return srv.register(sess, msg)
        if cmd == "release":
            srv.release(sess)
            return {}
        if cmd == "counters":
            return srv.counters()
        if cmd == "ping":
            return {}
        handler = HANDLERS.get(cmd)
        if handler is None:
            raise RequestError(f"unknown command {cmd!r}")
        return handler(srv, sess, msg)
