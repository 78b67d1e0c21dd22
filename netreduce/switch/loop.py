"""The control port's event loop: every connection on one thread (selectors).

Why not a thread per connection: at 1,000 ranks a thread-per-connection server holds
thousands of threads, each parked in a handler (a hello waiting for the others, a
long-poll, a watch), and every submission wakes all of them. Here a connection is a
socket, two byte buffers and the requests it has waiting (switch/waits.py): a
handler that would block returns a ``Wait``, parked until its topic is notified or
its ``due`` time passes, and answered from this thread.

What a line means is the server's (netreduce/switch/server.py, on the schema of
netreduce/protocol/messages.py); this module moves bytes. Per connection, a request
without an ``id`` is answered before the next line is
read (what every line client expects); requests that carry an ``id`` run
concurrently and their replies carry the same ``id`` back, so that one connection
can hold a rank's long-poll, its submissions and its failure watch at once.
Handlers registered as blocking (commands of other modules that wait on their own
conditions) run on a bounded thread pool; the negotiation and admission commands
run inline.

The limits of netreduce/switch/limits.py hold as before: a connection that is not
bound to a job may send lines of at most ``pending_line_bytes`` and must not stay
silent for ``pending_idle_s``; too many such connections close the oldest; a bound
one's lines are at most ``line_bytes``. No line is read into memory past its limit.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import selectors
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from netreduce.protocol import codec
from netreduce.switch.waits import Wait

log = logging.getLogger("netreduce.switch")
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
SWEEP_S = 0.25          # how often silent unbound connections are looked for
ACCEPT_BATCH = 64       # connections accepted per readiness event of the listener
POOL_THREADS = 4096     # blocking handlers at once (threads start as needed): a rendezvous
                        # gather holds one per rank until all have come (switch/rendezvous.py)
COMPACT_MIN = 256       # timer entries before finished waits are swept out of the heap


def _forget(w: Wait) -> None:
    """A finished wait keeps no reference to its job (the poll closure holds the job's
    state and the request), its connection or its answer: the timer heap may hold
    the wait itself until its deadline."""
    w.poll = None  # type: ignore[assignment]
    w.answer = w.conn = None  # type: ignore[attr-defined]


class Conn:
    __slots__ = ("sock", "sess", "rbuf", "wbuf", "busy", "closed", "eof", "last_rx",
                 "waits", "in_lines", "events", "close_after_write", "handshake")

    def __init__(self, sock: socket.socket, sess: Any) -> None:
        self.sock, self.sess = sock, sess
        self.rbuf, self.wbuf = bytearray(), bytearray()
        self.busy = False           # a request without id is being answered
        self.closed = self.eof = self.in_lines = self.close_after_write = False
        self.last_rx = time.monotonic()
        self.waits: Set[Wait] = set()
        self.events = 0
        # TLS (--tls-cert): the events the handshake waits for; 0 once it is done.
        self.handshake = 0


class EventLoop:
    """Sockets, parked waits and timers of one control server. The server supplies
    ``begin(conn, line)`` (parse and dispatch one request line), ``limit_of(sess)``,
    ``bound(sess)``, ``opened(sess, sock)``, ``closed(sess)`` and ``delivered``."""

    def __init__(self, server: Any, listener: socket.socket,
                 tls: Optional[ssl.SSLContext] = None) -> None:
        self.server = server
        self.listener = listener
        self.tls = tls  # every accepted connection speaks TLS (netreduce-switch --tls-cert)
        self.sel = selectors.DefaultSelector()
        self.rwake, self.wwake = socket.socketpair()
        self.rwake.setblocking(False)
        self.wwake.setblocking(False)
        self.calls: Deque[Callable[[], None]] = collections.deque()
        self.timers: List[Tuple[float, int, Wait]] = []
        self.compact_at = COMPACT_MIN
        self.counter = itertools.count()
        self.conns: Dict[int, Conn] = {}
        self.pool = ThreadPoolExecutor(max_workers=POOL_THREADS,
                                       thread_name_prefix="netreduce-control")
        self.thread: Optional[threading.Thread] = None
        self.accepting = True
        self.started = threading.Lock()

    # --- any thread ------------------------------------------------------------
    def start(self) -> None:
        with self.started:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="netreduce-control-loop",
                                               daemon=True)
                self.thread.start()

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.calls.append(fn)
        try:
            self.wwake.send(b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is pending already (or the loop is gone)

    def stop_accepting(self) -> None:
        def stop() -> None:
            if self.accepting:
                self.accepting = False
                try:
                    self.sel.unregister(self.listener)
                except (KeyError, ValueError, OSError):
                    pass
        if self.thread is None:
            self.accepting = False
        else:
            self.call_soon(stop)

    # --- the loop thread ----------------------------------------------------------
    def _run(self) -> None:
        self.sel.register(self.rwake, READ, "wake")
        if self.accepting:
            self.sel.register(self.listener, READ, "accept")
        next_sweep = time.monotonic() + SWEEP_S
        while True:
            now = time.monotonic()
            timeout = next_sweep - now
            if self.timers:
                timeout = min(timeout, self.timers[0][0] - now)
            try:
                events = self.sel.select(max(0.0, timeout))
            except OSError:
                events = []
            for key, mask in events:
                try:
                    if key.data == "wake":
                        self._drain_wake()
                    elif key.data == "accept":
                        self._accept()
                    else:
                        self._io(key.data, mask)
                except Exception:  # one connection's bug must not stop the daemon
                    log.exception("control loop: event failed")
                    if isinstance(key.data, Conn):
                        self.close(key.data)
            while self.calls:
                try:
                    self.calls.popleft()()
                except Exception:
                    log.exception("control loop: call failed")
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                due, _, w = heapq.heappop(self.timers)
                if not w.done and getattr(w, "timer_due", None) == due:
                    w.timer_due = None  # type: ignore[attr-defined]
                    self.poll_wait(w)
            if now >= next_sweep:
                next_sweep = now + SWEEP_S
                self._sweep(now)
                sweep = getattr(self.server, "sweep", None)  # the server's own deadlines
                if sweep is not None:
                    try:
                        sweep(now)
                    except Exception:  # a bug there must not stop the daemon
                        log.exception("control loop: the server's sweep failed")

    def _drain_wake(self) -> None:
        try:
            while self.rwake.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _accept(self) -> None:
        # A bounded batch per readiness event (the listener stays readable): a flood of
        # connections cannot queue so many at once that those already accepted (a
        # rank's register line) are shut as excess pending before they are read.
        for _ in range(ACCEPT_BATCH):
            if not self.accepting:
                return
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: try again on the next event
                log.warning("control port: accept failed: %s", exc)
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            if self.tls is not None:  # the handshake runs in the loop, like any I/O
                sock = self.tls.wrap_socket(sock, server_side=True,
                                            do_handshake_on_connect=False)
            conn = Conn(sock, self.server.new_session(addr))
            conn.sess.conn = conn  # the server may close it (an expired pending job)
            if self.tls is not None:
                conn.handshake = READ
            self.conns[sock.fileno()] = conn
            self._watch(conn)
            self.server.opened(conn.sess, sock)

    def _watch(self, conn: Conn) -> None:
        if conn.closed:
            return
        if conn.handshake:
            want = conn.handshake
        else:
            want = (READ if not conn.busy and not conn.eof else 0) | (WRITE if conn.wbuf else 0)
        if want == conn.events:
            return
        try:
            if conn.events == 0:
                self.sel.register(conn.sock, want, conn)
            elif want == 0:
                self.sel.unregister(conn.sock)
            else:
                self.sel.modify(conn.sock, want, conn)
        except (KeyError, ValueError, OSError):
            self.close(conn)
            return
        conn.events = want

    def _io(self, conn: Conn, mask: int) -> None:
        if conn.handshake:
            if not self._handshake(conn):
                return
            mask = READ  # the first request may have come with the handshake's last bytes
        if mask & WRITE:
            self._flush(conn)
        if mask & READ and not conn.closed:
            data = self._recv(conn)
            if data is None:
                return
            conn.last_rx = time.monotonic()
            if data:
                if not conn.rbuf and data[:2] == b"\x16\x03" and self.tls is None and \
                        not self.server.bound(conn.sess):
                    # A TLS ClientHello on a plaintext port: it would wait for a line
                    # end that never comes; closed at once, the client's handshake
                    # fails naming this address.
                    log.warning("refused control connection from %s: it speaks TLS, this "
                                "port does not (start netreduce-switch with --tls-cert, or "
                                "unset NETREDUCE_TLS_CA on the rank)", conn.sess.peer)
                    self.close(conn)
                    return
                conn.rbuf += data
            else:
                conn.eof = True
            self.lines(conn)

    def _recv(self, conn: Conn) -> Optional[bytes]:
        """What the connection has to read (b"" at its end), None for nothing yet. A
        TLS connection's decrypted bytes may wait inside the SSL object, where the
        selector cannot see them: those are read too."""
        try:
            data = conn.sock.recv(1 << 16)
            while data and isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending():
                data += conn.sock.recv(conn.sock.pending())
            return data
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return None
        except OSError:
            return b""

    def _handshake(self, conn: Conn) -> bool:
        """Advance a TLS handshake; True once it is done. A peer that fails it (no
        TLS, a client that rejects the certificate) is logged by address and closed."""
        conn.last_rx = time.monotonic()
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            conn.handshake = READ
        except ssl.SSLWantWriteError:
            conn.handshake = WRITE
        except (ssl.SSLError, OSError) as exc:
            log.warning("refused control connection from %s: TLS handshake failed: %s "
                        "(this port speaks TLS: give ranks NETREDUCE_TLS_CA)",
                        conn.sess.peer, getattr(exc, "reason", None) or exc)
            self.close(conn)
            return False
        else:
            conn.handshake = 0
            self._watch(conn)
            return True
        self._watch(conn)
        return False

    def lines(self, conn: Conn) -> None:
        """Answer the complete lines buffered (one at a time for requests without id)."""
        if conn.in_lines:
            return
        conn.in_lines = True
        try:
            while not conn.busy and not conn.closed:
                limit = self.server.limit_of(conn.sess)
                idx = conn.rbuf.find(b"\n", 0, limit + 1)
                if idx < 0:
                    if len(conn.rbuf) > limit:
                        self.refuse(conn, limit)
                        return
                    if not (conn.eof and conn.rbuf):
                        break
                    line = bytes(conn.rbuf)  # the last, unterminated line: answered
                    conn.rbuf.clear()
                else:
                    line = bytes(conn.rbuf[:idx + 1])
                    del conn.rbuf[:idx + 1]
                self.server.begin(self, conn, line)
        finally:
            conn.in_lines = False
        if conn.eof and not conn.busy and not conn.rbuf:
            conn.close_after_write = True
            if not conn.wbuf:
                self.close(conn)
                return
        self._watch(conn)

    def refuse(self, conn: Conn, limit: int) -> None:
        self.send(conn, codec.encode_error(f"request longer than {limit} bytes (the control "
                                              "port's limit); closing the connection"))
        self.close_after_write(conn)

    def close_after_write(self, conn: Conn) -> None:
        """Read nothing more; close once what is queued has gone out."""
        conn.rbuf.clear()
        conn.eof = True
        conn.close_after_write = True
        self._flush(conn)

    def send(self, conn: Conn, line: bytes) -> None:
        """Queue one encoded reply line (codec.encode_reply / encode_error)."""
        if conn.closed:
            return
        conn.wbuf += line
        self._flush(conn)

    def _flush(self, conn: Conn) -> None:
        while conn.wbuf and not conn.closed:
            try:
                n = conn.sock.send(conn.wbuf)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError,
                    ssl.SSLWantWriteError):
                break
            except OSError:
                self.close(conn)
                return
            del conn.wbuf[:n]
        if not conn.wbuf and conn.close_after_write:
            self.close(conn)
            return
        self._watch(conn)

    def finished(self, conn: Conn, sequential: bool) -> None:
        """A request's reply went out: a sequential one lets the next line be read."""
        if sequential:
            conn.busy = False
            self.lines(conn)

    # --- waits ------------------------------------------------------------------
    def park(self, conn: Conn, w: Wait, answer: Callable[[Any, Optional[BaseException]],
                                                         None]) -> None:
        w.answer = answer  # type: ignore[attr-defined]
        w.conn = conn  # type: ignore[attr-defined]
        w.timer_due = None  # type: ignore[attr-defined]
        w.on_fire = lambda wait: self.call_soon(lambda: self.poll_wait(wait))
        conn.waits.add(w)
        with w.topic.cond:
            w.topic.waiters.add(w)
        self.poll_wait(w)

    def poll_wait(self, w: Wait) -> None:
        w.scheduled = False
        conn: Conn = w.conn  # type: ignore[attr-defined]
        if w.done:
            return
        reply, error = None, None
        with w.topic.cond:
            if conn.closed:
                w.done = True
            else:
                try:
                    reply = w.poll(w)
                except Exception as exc:  # the handler's error, answered as ok=false
                    error = exc
                if reply is not None or error is not None:
                    w.done = True
            if w.done:
                w.topic.waiters.discard(w)
        if not w.done:
            due = w.due
            if due is not None and (w.timer_due is None or due < w.timer_due):  # type: ignore
                w.timer_due = due  # type: ignore[attr-defined]
                self._push_timer(due, w)
            return
        conn.waits.discard(w)
        answer = w.answer  # type: ignore[attr-defined]
        _forget(w)
        if not conn.closed:
            answer(reply, error)

    def _push_timer(self, due: float, w: Wait) -> None:
        """A wait answered early stays in the heap until its deadline (a hello's is the
        start timeout): past twice the live entries, drop the finished ones, so that a
        job restarted every few milliseconds does not pile them up."""
        heapq.heappush(self.timers, (due, next(self.counter), w))
        if len(self.timers) >= self.compact_at:
            self.timers = [t for t in self.timers if not t[2].done]
            heapq.heapify(self.timers)
            self.compact_at = max(COMPACT_MIN, 2 * len(self.timers))

    # --- closing ------------------------------------------------------------------
    def _sweep(self, now: float) -> None:
        idle = self.server.limits.pending_idle_s
        for conn in list(self.conns.values()):
            if not conn.closed and not self.server.bound(conn.sess) and \
                    now - conn.last_rx >= idle:
                log.debug("%s: silent for %.0f s before binding to a job: closed",
                          conn.sess.peer, idle)
                self.close(conn)

    def close(self, conn: Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.conns.pop(conn.sock.fileno(), None)
        if conn.events:
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        try:
            conn.sock.close()
        except OSError:
            pass
        for w in list(conn.waits):
            with w.topic.cond:
                w.done = True
                w.topic.waiters.discard(w)
            _forget(w)
        conn.waits.clear()
        self.server.closed(conn.sess)

    def close_listener(self) -> None:
        def close() -> None:
            self.accepting = False
            try:
                self.sel.unregister(self.listener)
            except (KeyError, ValueError, OSError):
                pass
            try:
                self.listener.close()
            except OSError:
                pass
        if self.thread is None:
            close()
        else:
            self.call_soon(close)
