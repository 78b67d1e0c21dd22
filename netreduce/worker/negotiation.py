"""Rank side of negotiation: requests, the response cache, and the connection to
the coordinator (netreduce/switch/coordinator.py has the protocol essay).

One connection per rank carries three kinds of request at once, each with an id
(mux.py): one outstanding ``negotiate`` — it submits what this rank has and
long-polls at the aggregator until the global log has something new; the
background thread waits on its reply (a pipe) and on its own wake-up pipe with
select(), so a submission made while the poll is out goes at once as a
``negotiate_submit``; and one ``negotiate_watch`` that the coordinator answers only
when the job fails, so failures arrive even when no negotiation is outstanding.
Tensors already in the response cache skip all of this in the steady state
(netreduce/worker/response_cache.py).
"""
from __future__ import annotations

import json
import socket
import threading
from typing import Any, Dict, List, Optional, Tuple

from netreduce import config
from netreduce.errors import ControlPlaneError
from netreduce.protocol import auth, tls
from netreduce.worker.mux import Mailbox, Multiplexed

Sig = Tuple[str, str, Tuple[int, ...], str, float, float, int]


class LineConnection:
    """One persistent TCP connection speaking the control server's JSON lines. Keeps
    its own socket (not ControlClient) because the coordinator binds a connection to
    a rank: the session is the unit of liveness."""

    def __init__(self, address: Tuple[str, int], timeout: float) -> None:
        self.address = address
        self.sock = tls.connect(address, timeout)  # TLS with NETREDUCE_TLS_CA (protocol/tls.py)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(None)
        self._buf = b""
        self.lock = threading.Lock()

    def where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def send(self, cmd: str, **fields: Any) -> None:
        fields["cmd"] = cmd
        data = (json.dumps(fields, separators=(",", ":")) + "\n").encode()
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ControlPlaneError(f"lost the connection to the aggregator at "
                                    f"{self.where()}: {exc}") from None

    def pending(self) -> bool:
        """True when a whole reply is already buffered (select would not see it)."""
        return b"\n" in self._buf

    def recv(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        reply = self.recv_line(timeout)
        if not reply.get("ok", False):
            raise ControlPlaneError(f"aggregator {self.where()}: "
                                    f"{reply.get('error', 'request refused')}")
        return reply

    def recv_line(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """The next reply as it came (ok=false included)."""
        try:
            self.sock.settimeout(timeout)
            while b"\n" not in self._buf:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    raise ControlPlaneError(f"the aggregator at {self.where()} closed the "
                                            "control connection (did it exit?)")
                self._buf += chunk
        except socket.timeout:
            raise ControlPlaneError(f"the aggregator at {self.where()} did not answer "
                                    f"within {timeout} s") from None
        except OSError as exc:
            raise ControlPlaneError(f"lost the connection to the aggregator at "
                                    f"{self.where()}: {exc}") from None
        finally:
            try:
                self.sock.settimeout(None)
            except OSError:
                pass  # closed meanwhile by shutdown(); the error above says enough
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise ControlPlaneError(f"the aggregator at {self.where()} sent a reply that is "
                                    f"not JSON: {line[:200]!r}") from None

    def call(self, cmd: str, reply_within: Optional[float] = None,
             **fields: Any) -> Dict[str, Any]:
        with self.lock:
            self.send(cmd, **fields)
            return self.recv(reply_within)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        try:
            # shutdown first: a thread blocked in recv() on this socket (mux.py's
            # reader) would keep it open, and the aggregator would never see it close
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def wire_request(name: str, sig: Sig, cacheable: bool) -> Dict[str, Any]:
    kind, dtype, shape, op, pre, post, root = sig
    req: Dict[str, Any] = {"n": name, "k": kind, "d": dtype, "s": list(shape), "o": op}
    if pre != 1.0:
        req["pre"] = pre
    if post != 1.0:
        req["post"] = post
    if root >= 0:
        req["r"] = root
    if not cacheable:
        req["c"] = 0
    return req


def sig_of(req: Dict[str, Any]) -> Sig:
    """The signature a request dict describes (inverse of wire_request)."""
    return (str(req["k"]), str(req["d"]), tuple(int(x) for x in req["s"]), str(req["o"]),
            float(req.get("pre", 1.0)), float(req.get("post", 1.0)), int(req.get("r", -1)))


class ResponseCache:
    """name <-> id as the coordinator assigned them. A name goes out as its id only
    when this rank's signature equals the one the id was assigned for."""

    def __init__(self) -> None:
        self.id_of: Dict[str, Tuple[int, Sig]] = {}
        self.name_of: Dict[int, str] = {}
        self.hits = 0

    def encode(self, name: str, sig: Sig, cacheable: bool) -> Any:
        known = self.id_of.get(name)
        if known is not None and known[1] == sig:
            self.hits += 1
            return known[0]
        return wire_request(name, sig, cacheable)

    def learn(self, assign: Dict[str, int], sigs: Dict[str, Sig]) -> None:
        for name, new_id in assign.items():
            old = self.id_of.get(name)
            if old is not None:
                self.name_of.pop(old[0], None)
            self.id_of[name] = (new_id, sigs[name])
            self.name_of[new_id] = name

    def resolve(self, ref: Any) -> str:
        return self.name_of[ref] if isinstance(ref, int) else ref


class NegotiationClient:
    """One rank's connection to the coordinator, after the hello handshake (which
    returns once every rank of the job has joined, or fails naming the missing
    ranks). Its long-poll, submissions and failure watch share the connection
    (mux.py): the coordinator answers each when it can."""

    def __init__(self, address: Tuple[str, int], job: str, rank: int, size: int, *,
                 threshold: int, capacity: int, start_timeout: float,
                 timeout: float = 30.0, agree: bool = False) -> None:
        self.address, self.job, self.rank, self.size = address, job, rank, size
        self.timeout = timeout  # NETREDUCE_TIMEOUT: how long a short request may take
        hello = dict(job=job, rank=rank, size=size, threshold=threshold, capacity=capacity,
                     timeout=start_timeout, agree=int(agree))
        epoch = config.get("NETREDUCE_EPOCH")  # an elastic job's membership (docs/elastic.md)
        if epoch:
            hello["epoch"] = epoch
        self.requests = 0  # negotiation requests sent (steady state: one per cycle)
        secret = auth.job_secret()  # proved, never sent (protocol/auth.py)
        self.conn = LineConnection(address, timeout=start_timeout)
        where = self.conn.where()
        self.poll_conn = Mailbox(where)  # the long-poll's reply, select()-able
        try:
            # Hello at once: the aggregator closes the oldest of too many connections
            # that have not (switch/limits.py).
            reply = self.conn.call("negotiate_hello", role="all",
                                   reply_within=start_timeout + 10, **hello,
                                   **auth.prove(self.conn.call, secret, job, rank))
            self.mux = Multiplexed(self.conn)
        except Exception:
            self.close()
            raise
        self.next_seq = int(reply.get("seq", 0))
        # The job's settings, from its first rank's hello: every rank runs the same
        # agreement rounds (netreduce/worker/response_cache.py) over the same vector width.
        self.agree = bool(reply.get("agree", False))
        self.width = int(reply.get("capacity", capacity))
        self.threshold = int(reply.get("threshold", threshold))

    def send_poll(self, reqs: List[Any], wait_ms: float, stall_s: float) -> None:
        self.requests += 1
        self.mux.send("negotiate", self.poll_conn.deliver, reqs=reqs, ack=self.next_seq,
                      wait_ms=wait_ms, stall_s=stall_s)

    def recv_poll(self) -> Dict[str, Any]:
        return self.poll_conn.take()

    def submit(self, reqs: List[Any]) -> None:
        self.requests += 1
        self.mux.call("negotiate_submit", self.timeout, reqs=reqs)

    def watch(self) -> Dict[str, Any]:
        """Blocks until the coordinator reports the job failed (or this rank left)."""
        return self.mux.call("negotiate_watch", None)

    def bye(self, done: int) -> None:
        self.mux.call("negotiate_bye", min(self.timeout, 10.0), done=done)

    def abort(self, reason: str) -> None:
        self.mux.call("negotiate_abort", min(self.timeout, 10.0), reason=reason)

    def close(self) -> None:
        self.conn.close()
        self.poll_conn.close()
