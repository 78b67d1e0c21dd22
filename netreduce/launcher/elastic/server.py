"""The elastic driver's port: where workers learn their place and the host updates.

It speaks the control protocol's schema (netreduce/protocol/messages.py): one JSON
object per line each way, ``hello`` with the protocol version first (another
version is refused naming both, and the connection closes), then ``challenge`` and
``elastic_bind`` — the worker HOST:SLOT proving the job's secret as a rank proves it
at an aggregator (protocol/auth.py, for the job's name and rank -1) — then, on the
bound connection:

* ``elastic_join`` {after}: this worker's place in the first epoch after ``after``,
  or why it has none (removed, or the job stopped); waits while the driver forms it;
* ``elastic_updates`` {seen, wait}: the host updates past ``seen``, once there is one
  (or ``wait`` seconds passed);
* ``elastic_status``: the current epoch and whether it is ending.

A worker holds two connections (its join, its updates poll), each served by a thread
here: a job's workers, not thousands of ranks. With NETREDUCE_TLS_CERT the port
serves TLS, as the job's other servers do (protocol/tls.py).
"""
from __future__ import annotations

import logging
import socket
import socketserver
import threading
from typing import Any, Callable, Dict, Optional

from netreduce._version import __version__
from netreduce.errors import NetReduceError
from netreduce.protocol import auth, codec, messages, tls

log = logging.getLogger("netreduce.elastic")

LINE_LIMIT = 64 * 1024
WORKER_RANK = -1  # the rank a worker's proof names: a worker has no fixed rank

Handler = Callable[[str, messages.Request], messages.Reply]


class BadRequest(NetReduceError):
    """A request the driver cannot answer; the worker gets it as {ok: false, error}."""


class _Session:
    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.state: Dict[str, Any] = {}
        self.greeted = False
        self.worker: Optional[str] = None


class DriverServer:
    """Serves ``handlers`` {request type: fn(worker, request) -> reply} to bound workers."""

    def __init__(self, host: str, job: str, secret: str,
                 handlers: Dict[type, Handler]) -> None:
        self.job = job
        self.handlers = handlers
        self.guard = auth.Guard(require_secret=True, job_keys={job: auth.public_key(secret, job)})
        self.tls = tls.job_server_context()
        server = self

        class Connection(socketserver.StreamRequestHandler):
            def setup(self) -> None:
                if server.tls is not None:
                    self.request = server.tls.wrap_socket(self.request, server_side=True)
                super().setup()

            def handle(self) -> None:
                server._serve(self.connection, self.rfile, self.wfile, self.client_address)

        class Threaded(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

            def handle_error(self, request: Any, client_address: Any) -> None:
                log.debug("elastic driver: connection from %s failed", client_address,
                          exc_info=True)

        self.tcp = Threaded((host, 0), Connection)
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
                reply, keep = self._answer(sess, line)
                wfile.write(reply)
                wfile.flush()
                if not keep:
                    return
        except (OSError, ValueError):
            return
        finally:
            self.guard.unbind(sess)

    def _answer(self, sess: _Session, line: bytes) -> "tuple[bytes, bool]":
        """A request line -> (its reply line, whether the connection stays open)."""
        try:
            msg = codec.decode_request(line)
        except codec.ProtocolError as exc:
            return codec.encode_error(str(exc), exc.rid), sess.greeted
        if not sess.greeted:
            return self._greet(sess, msg)
        try:
            return codec.encode_reply(self._dispatch(sess, msg), msg.id), True
        except (BadRequest, auth.AuthError) as exc:
            return codec.encode_error(str(exc), msg.id), True
        except Exception:  # a handler's bug must not end the driver, nor go to a worker
            log.exception("elastic driver: request %r failed", msg)
            return codec.encode_error(f"the elastic driver could not serve "
                                         f"'{messages.command(msg)}' (an internal error, "
                                         "logged by netreduce-run)", msg.id), True

    def _greet(self, sess: _Session, msg: messages.Request) -> "tuple[bytes, bool]":
        mine = messages.PROTOCOL_VERSION
        me = f"this elastic driver (netreduce-run {__version__}) speaks control protocol {mine}"
        if not isinstance(msg, messages.Hello) or msg.version != mine:
            theirs = (f"protocol {msg.version}" if isinstance(msg, messages.Hello) else
                      f"'{messages.command(msg)}' without a protocol version")
            return codec.encode_error(f"{me}, but the worker sent {theirs}; run the same "
                                         "netreduce on the workers as netreduce-run", msg.id), False
        sess.greeted = True
        return codec.encode_reply(messages.HelloReply(
            version=mine, software=f"netreduce-run {__version__}"), msg.id), True

    def _dispatch(self, sess: _Session, msg: messages.Request) -> messages.Reply:
        if isinstance(msg, messages.Challenge):
            return self.guard.challenge(sess)
        if isinstance(msg, messages.ElasticBind):
            if msg.job != self.job:
                raise BadRequest(f"worker {msg.worker}: this elastic driver runs job "
                                 f"'{self.job}', not '{msg.job}'")
            try:
                self.guard.admit(sess, msg.job, WORKER_RANK, msg.auth)
            except auth.AuthError:  # its words are an aggregator's: say the driver's
                raise BadRequest(
                    f"worker {msg.worker} (from {sess.peer}) is not admitted to job "
                    f"'{self.job}': its proof of the job's secret "
                    f"{'is missing' if msg.auth is None else 'does not verify'} (netreduce-run "
                    "gives each worker the job's NETREDUCE_JOB_SECRET)") from None
            sess.worker = msg.worker
            return messages.Empty()
        if sess.worker is None:
            raise BadRequest(f"'{messages.command(msg)}' before 'elastic_bind' (with the job's "
                             "proof) on this connection")
        handler = self.handlers.get(type(msg))
        if handler is None:
            raise BadRequest(f"'{messages.command(msg)}' is not served by the elastic driver")
        return handler(sess.worker, msg)
