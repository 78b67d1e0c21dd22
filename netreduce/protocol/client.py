"""The one client connection to a control port (an aggregator's, or a job's own
rendezvous): what the schema and its codec (protocol/messages.py, codec.py) do
not do — the socket (TLS with NETREDUCE_TLS_CA: protocol/tls.py), line framing,
request ids, the protocol version said first, and errors that name what answered.

A request is a messages.Request; ``request()`` sends it and returns its typed reply
(ControlPlaneError on a refusal, a lost connection or a timeout). Several requests
may be in flight at once: ``send()`` hands a reply to a callback, read by one reader
thread that starts with the first ``send()``; until then each ``request()`` reads its
own reply on the calling thread (most connections never need the thread).
``call(cmd, **fields)`` is the same by command name with plain dicts, for tests
and tools.

The connection stays open for the client's life: an aggregator takes a rank's
connection closing as the rank having left its job."""
from __future__ import annotations

import itertools
import queue
import socket
import ssl
import threading
from typing import Any, Callable, Dict, Optional, Type, Union

import msgspec

from netreduce._version import __version__
from netreduce.errors import ControlPlaneError
from netreduce.protocol import codec, messages, tls
from netreduce.protocol.address import Address, format_address, parse_address  # noqa: F401

Deliver = Callable[[Any], None]  # gets the typed reply, or the ControlPlaneError
HELLO_ID = 0                     # the version exchange's request id; requests count from 1


class ControlConnection:
    """A persistent connection to a control port. Safe to share between threads."""

    def __init__(self, address: Address, timeout: Optional[float] = 30.0,
                 aggregator: Optional[bool] = None, reach_for: float = 0.0) -> None:
        self.address = (address[0], int(address[1]))
        self.where = format_address(self.address)
        self.timeout = timeout
        self._ids = itertools.count(HELLO_ID + 1)
        self._lock = threading.Lock()       # sending, the tables below
        self._read_lock = threading.Lock()  # one reader of the socket at a time
        self._waiting: Dict[int, Any] = {}  # id -> (reply type, deliver)
        self._broken: Optional[ControlPlaneError] = None
        self._reader: Optional[threading.Thread] = None
        self._buf = bytearray()
        # TLS when NETREDUCE_TLS_CA is set (protocol/tls.py): to an aggregator, and to
        # the job's own servers when they serve it; ``aggregator`` as in tls.connect.
        # ``reach_for``: how long a refused connection is tried again (tls.connect).
        self._sock = tls.connect(self.address, timeout, aggregator=aggregator, reach_for=reach_for)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._greeted = False
        # The version exchange goes out at once, its answer is read with the first
        # reply: no round trip of its own.
        self._write(codec.encode_request(messages.Hello(
            id=HELLO_ID, version=messages.PROTOCOL_VERSION, software=f"netreduce {__version__}")),
            "hello")

    # --- typed requests ------------------------------------------------------------
    def request(self, msg: messages.Request, timeout: Optional[float] = None) -> Any:
        """Send ``msg`` and return its reply (the type messages.REPLY_OF names)."""
        timeout = self.timeout if timeout is None else timeout
        if self._reader is not None:
            box: "queue.Queue[Any]" = queue.Queue(1)
            self.send(msg, box.put)
            try:
                return _checked(box.get(timeout=timeout))
            except queue.Empty:
                raise ControlPlaneError(f"the aggregator at {self.where} did not answer "
                                        f"'{messages.command(msg)}' within {timeout} s") from None
        with self._read_lock:
            if self._reader is not None:  # started while this call waited for the lock
                return self.request(msg, timeout)
            try:
                rid = self._post(msg, None)
            except ControlPlaneError:
                if not self._greeted:  # the answer to hello, if any, says more (a refusal
                    # of this version, a TLS port, not an aggregator) than a reset write
                    self._read_until(HELLO_ID, 2.0 if timeout is None else min(timeout, 2.0),
                                     "hello")
                raise
            return _checked(self._read_until(rid, timeout, messages.command(msg)))

    def send(self, msg: messages.Request, deliver: Deliver) -> None:
        """Send ``msg``; ``deliver`` gets its reply (or the ControlPlaneError) on the
        reader thread, whenever the server answers."""
        with self._read_lock:
            if self._reader is None:
                self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                                name="netreduce-control-reader")
                self._reader.start()
        self._post(msg, deliver)

    def call(self, cmd: str, timeout: Optional[float] = None, **fields: Any) -> Dict[str, Any]:
        """``cmd`` by name with ``fields`` (validated against the schema before it is
        sent); the reply's fields as a dict."""
        try:
            msg = codec.build(cmd, **fields)
        except codec.ProtocolError as exc:
            raise ControlPlaneError(f"aggregator {self.where}: {exc}") from None
        return codec.to_builtins(self.request(msg, timeout))

    # --- the socket ----------------------------------------------------------------
    def _post(self, msg: messages.Request, deliver: Optional[Deliver]) -> int:
        with self._lock:
            if self._broken is not None:
                raise self._broken
            rid = next(self._ids)
            msg.id = rid
            self._waiting[rid] = (messages.REPLY_OF[type(msg)], deliver)
            try:
                self._write(codec.encode_request(msg), messages.command(msg))
            except ControlPlaneError:
                self._waiting.pop(rid, None)
                raise
        return rid

    def _write(self, data: bytes, cmd: str) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise self._closed(cmd, exc) from None

    def _line(self, timeout: Optional[float], cmd: str) -> bytes:
        """The next line (the caller holds the read lock, or is the reader)."""
        try:
            self._sock.settimeout(timeout)
            while True:
                end = self._buf.find(b"\n")
                if end >= 0:
                    line = bytes(self._buf[:end + 1])
                    del self._buf[:end + 1]
                    return line
                chunk = self._sock.recv(1 << 16)
                if not chunk:
                    raise self._closed(cmd, None)
                self._buf += chunk
        except socket.timeout:
            raise ControlPlaneError(f"the aggregator at {self.where} did not answer "
                                    f"'{cmd}' within {timeout} s"
                                    + ("" if self._greeted else
                                       " (is it a netreduce aggregator?)")) from None
        except ControlPlaneError:
            raise
        except OSError as exc:
            raise self._closed(cmd, exc) from None

    def _closed(self, cmd: str, exc: Optional[OSError]) -> ControlPlaneError:
        """The connection ended: say why as well as we can tell."""
        if not self._greeted and not isinstance(self._sock, ssl.SSLSocket) and \
                tls.speaks_tls(self.address):
            return ControlPlaneError(
                f"the aggregator at {self.where} speaks TLS: set NETREDUCE_TLS_CA to the CA "
                "that signed its certificate (docs/operations.md, Security)")
        if exc is not None:
            return ControlPlaneError(f"lost the connection to the aggregator at {self.where} "
                                     f"during '{cmd}': {exc}")
        return ControlPlaneError(f"aggregator {self.where} closed the control connection "
                                 f"during '{cmd}' (did it exit?)")

    def _route(self, line: bytes) -> "tuple[Optional[int], Any]":
        """(request id, reply or ControlPlaneError) of one line; the first line
        answers the version exchange."""
        try:
            env = codec.decode_envelope(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            text = line.decode("utf-8", "replace").strip()
            shown = text[:60] + ("…" if len(text) > 60 else "")
            raise ControlPlaneError(f"{self.where} answered, but not as a netreduce aggregator "
                                    f"(it sent {shown!r})") from None
        rid = env.id
        if not self._greeted:
            if rid not in (HELLO_ID, None):
                raise ControlPlaneError(f"{self.where} answered, but not as a netreduce "
                                        f"aggregator (a reply to request {rid} before hello)")
            self._greeted = True
            if not env.ok:
                raise ControlPlaneError(_version_refusal(self.where, env.error))
            return HELLO_ID, None
        with self._lock:
            if rid is None and len(self._waiting) == 1:  # a refusal of a line it could
                rid = next(iter(self._waiting))           # not read: the one request out
            kind, deliver = self._waiting.pop(rid, (None, None))
        if kind is None:
            return None, None  # an answer to nobody (a request that gave up): dropped
        if not env.ok:
            return rid, (ControlPlaneError(f"aggregator {self.where}: {env.error or 'refused'}"),
                         deliver)
        try:
            return rid, (codec.decode_reply(line, kind), deliver)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return rid, (ControlPlaneError(f"aggregator {self.where} sent a reply this rank "
                                           f"cannot read ({exc}): a different netreduce "
                                           "version?"), deliver)

    def _read_until(self, rid: int, timeout: Optional[float], cmd: str) -> Any:
        try:
            while True:
                got, routed = self._route(self._line(timeout, cmd))
                if got == rid:
                    return routed[0]
        except ControlPlaneError as exc:
            with self._lock:
                self._waiting.pop(rid, None)
                if not self._greeted or "did not answer" not in str(exc):
                    self._broken = exc  # nothing more can be read from this connection
            raise

    def _read_loop(self) -> None:
        while True:
            try:
                got, routed = self._route(self._line(None, "the connection"))
            except ControlPlaneError as exc:
                with self._lock:
                    self._broken = exc
                    waiting, self._waiting = self._waiting, {}
                for _, deliver in waiting.values():
                    if deliver is not None:
                        deliver(exc)
                return
            if routed is not None and routed[1] is not None:
                routed[1](routed[0])

    # --- the rest ------------------------------------------------------------------
    @property
    def sock(self) -> socket.socket:
        """The socket, for watching (select) or its local address; never read it."""
        return self._sock

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        try:
            # shutdown first: a reader thread blocked in recv() would keep the socket
            # open, and the aggregator would never see the rank leave
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> "ControlConnection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


ControlClient = ControlConnection  # the name it had


def _checked(reply: Union[Any, ControlPlaneError]) -> Any:
    if isinstance(reply, ControlPlaneError):
        raise reply
    return reply


def _version_refusal(where: str, error: str) -> str:
    """The aggregator did not take this client's hello."""
    mine = messages.PROTOCOL_VERSION
    if "unknown command 'hello'" in error:  # protocol 1 had no version exchange
        return (f"the aggregator at {where} speaks control protocol 1 (a netreduce from "
                f"before the versioned protocol; it does not know 'hello'), this rank "
                f"(netreduce {__version__}) speaks control protocol {mine}; run the same "
                "netreduce version on the ranks and the aggregators")
    return f"aggregator {where} refused this rank (netreduce {__version__}, control protocol " \
           f"{mine}): {error}"


ReplyType = Type[messages.Reply]
