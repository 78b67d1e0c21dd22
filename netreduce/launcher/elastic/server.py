"""The elastic driver's port: where workers learn their place and host updates.

JSON lines over TCP, one request and one reply at a time per connection (a worker
holds two: one for ``join``, one long-polling ``updates``). Every connection first
proves the job's secret on a challenge, as a rank does at the aggregator
(protocol/auth.py, for the job's name and rank -1), so that nobody else can take a
worker's place or watch the job:

* ``challenge`` -> {nonce}
* ``hello`` {job, worker, auth} -> {}: binds the connection to worker HOST:SLOT
* ``join`` {after} -> this worker's place in the first epoch after ``after``
  ({epoch, rank, size, local_rank, local_size, cross_rank, cross_size, updates}),
  or {removed: why}; waits while the driver forms that epoch
* ``updates`` {seen, wait} -> {update, changes: [[n, flags]...]} once the driver has
  counted a host update past ``seen`` (or ``wait`` seconds passed)

A refused or malformed request is answered {ok: false, error}.
"""
from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
from typing import Any, Callable, Dict, Optional

from netreduce.errors import NetReduceError
from netreduce.protocol import auth

log = logging.getLogger("netreduce.elastic")

LINE_LIMIT = 64 * 1024
WORKER_RANK = -1  # the rank a worker's proof names: a worker has no fixed rank


class BadRequest(NetReduceError):
    """A request the driver cannot answer; the worker gets it as {ok: false, error}."""


class _Session:
    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.state: Dict[str, Any] = {}
        self.worker: Optional[str] = None


class DriverServer:
    """Serves ``handlers`` {cmd: fn(worker, msg) -> reply} to bound workers."""

    def __init__(self, host: str, job: str, secret: str,
                 handlers: Dict[str, Callable[[str, Dict[str, Any]], Dict[str, Any]]]) -> None:
        self.job = job
        self.handlers = handlers
        self.guard = auth.Guard(require_secret=True, job_keys={job: auth.public_key(secret, job)})
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                server._serve(self.connection, self.rfile, self.wfile, self.client_address)

        class Threaded(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self.tcp = Threaded((host, 0), Handler)
        self.address = self.tcp.server_address[:2]
        self.thread = threading.Thread(target=self.tcp.serve_forever, name="nr-elastic-driver",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.tcp.shutdown()
        self.tcp.server_close()

    def _serve(self, conn: socket.socket, rfile: Any, wfile: Any, peer: Any) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sess = _Session(f"{peer[0]}:{peer[1]}")
        try:
            while True:
                line = rfile.readline(LINE_LIMIT)
                if not line:
                    return
                reply = self._answer(sess, line)
                wfile.write((json.dumps(reply, separators=(",", ":")) + "\n").encode())
                wfile.flush()
        except (OSError, ValueError):
            return
        finally:
            self.guard.unbind(sess)

    def _answer(self, sess: _Session, line: bytes) -> Dict[str, Any]:
        try:
            msg = json.loads(line)
            if not isinstance(msg, dict):
                raise BadRequest("a request is a JSON object")
            cmd = msg.get("cmd")
            if cmd == "challenge":
                return {"nonce": self.guard.challenge(sess).nonce, "ok": True}
            if cmd == "hello":
                worker = str(msg["worker"])
                self.guard.admit(sess, str(msg.get("job")), WORKER_RANK, msg.get("auth"))
                if str(msg.get("job")) != self.job:
                    raise BadRequest(f"this driver runs job '{self.job}', not '{msg.get('job')}'")
                sess.worker = worker
                return {"ok": True}
            if sess.worker is None:
                raise BadRequest("say 'hello' (with the job's proof) first")
            handler = self.handlers.get(str(cmd))
            if handler is None:
                raise BadRequest(f"unknown command {cmd!r}")
            return dict(handler(sess.worker, msg), ok=True)
        except auth.AuthError as exc:
            return {"ok": False, "error": str(exc)}
        except (BadRequest, KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "error": f"bad request {line[:200]!r}: {exc}"}
        except Exception as exc:  # a handler's bug must not end the driver
            log.exception("elastic driver request %r failed", line[:200])
            return {"ok": False, "error": f"internal error in the elastic driver: {exc!r}"}
