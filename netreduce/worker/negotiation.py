"""Rank side of negotiation: the connection to the coordinator
(netreduce/switch/coordinator.py has the protocol essay; the messages are
netreduce/protocol/messages.py's, the response cache netreduce/worker/response_cache.py's).

One connection per rank (protocol/client.py) carries three kinds of request at
once, each with an id: one outstanding ``negotiate`` — it submits what this rank
has and long-polls at the aggregator until the global log has something new; the
background thread waits on its reply (a Mailbox: a pipe) and on its own wake-up
pipe with select(), so a submission made while the poll is out goes at once as a
``negotiate_submit``; and one ``negotiate_watch`` that the coordinator answers only
when the job fails, so failures arrive even when no negotiation is outstanding.
Tensors already in the response cache skip all of this in the steady state
(netreduce/worker/agreement.py).
"""
from __future__ import annotations

import os
import select
import threading
from typing import Any, List, Optional, Tuple

from netreduce import config
from netreduce.errors import ControlPlaneError
from netreduce.protocol import auth, messages
from netreduce.protocol.client import ControlConnection
from netreduce.protocol.messages import TensorRequest
from netreduce.protocol.signature import Signature

Sig = Signature  # the old name


def sig_of(req: TensorRequest) -> Signature:
    """The signature a tensor request carries."""
    return req.signature()


class Mailbox:
    """One reply at a time, readable with select() (its fileno is a pipe's end): how
    the communicator's negotiation thread waits for its long-poll next to its own
    wake-up pipe."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._r, self._w = os.pipe()
        self._lock = threading.Lock()
        self._reply: Any = None

    def deliver(self, reply: Any) -> None:
        with self._lock:
            self._reply = reply
        try:
            os.write(self._w, b"x")
        except OSError:
            pass  # closed: nobody reads any more

    def pending(self) -> bool:
        with self._lock:
            return self._reply is not None

    def take(self, timeout: Optional[float] = None) -> Any:
        with self._lock:
            reply, self._reply = self._reply, None
        if reply is None:
            ready, _, _ = select.select([self._r], [], [], timeout)
            if not ready:
                raise ControlPlaneError(f"the aggregator at {self.where} did not answer "
                                        f"within {timeout} s")
            with self._lock:
                reply, self._reply = self._reply, None
        try:
            os.read(self._r, 4096)
        except OSError:
            pass
        if isinstance(reply, ControlPlaneError):
            raise reply
        return reply

    def fileno(self) -> int:
        return self._r

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


class NegotiationClient:
    """One rank's connection to the coordinator, after the hello handshake (which
    returns once every rank of the job has joined, or fails naming the missing
    ranks). Its long-poll, submissions and failure watch share the connection: the
    coordinator answers each when it can."""

    def __init__(self, address: Tuple[str, int], job: str, rank: int, size: int, *,
                 threshold: int, capacity: int, start_timeout: float,
                 timeout: float = 30.0, agree: bool = False) -> None:
        self.address, self.job, self.rank, self.size = address, job, rank, size
        self.timeout = timeout  # NETREDUCE_TIMEOUT: how long a short request may take
        self.requests = 0  # negotiation requests sent (steady state: one per cycle)
        secret = auth.job_secret()  # proved, never sent (protocol/auth.py)
        self.conn = ControlConnection(address, timeout=start_timeout)
        self.poll_conn = Mailbox(self.conn.where)  # the long-poll's reply, select()-able
        try:
            # Hello at once: the aggregator closes the oldest of too many connections
            # that have not (switch/limits.py).
            reply = self.conn.request(messages.NegotiateHello(
                job=job, rank=rank, size=size, role="all", threshold=threshold,
                capacity=capacity, timeout=start_timeout, agree=agree,
                # an elastic job's membership (docs/elastic.md, switch/epochs.py)
                epoch=int(config.get("NETREDUCE_EPOCH") or 0),
                auth=auth.prove_on(self.conn, secret, job, rank)), timeout=start_timeout + 10)
        except Exception:
            self.close()
            raise
        self.next_seq = reply.seq
        # The job's settings, from its first rank's hello: every rank runs the same
        # agreement rounds (netreduce/worker/agreement.py) over the same vector width.
        self.agree = reply.agree
        self.width = reply.capacity or capacity
        self.threshold = reply.threshold or threshold

    def send_poll(self, reqs: List[Any], wait_ms: float, stall_s: float) -> None:
        self.requests += 1
        self.conn.send(messages.Negotiate(reqs=reqs, ack=self.next_seq, wait_ms=wait_ms,
                                          stall_s=stall_s), self.poll_conn.deliver)

    def recv_poll(self) -> messages.NegotiateReply:
        return self.poll_conn.take()

    def submit(self, reqs: List[Any]) -> None:
        self.requests += 1
        self.conn.request(messages.NegotiateSubmit(reqs=reqs), self.timeout)

    def watch(self) -> messages.WatchReply:
        """Blocks until the coordinator reports the job failed (or this rank left)."""
        box = Mailbox(self.conn.where)
        try:
            self.conn.send(messages.NegotiateWatch(), box.deliver)
            return box.take()
        finally:
            box.close()

    def bye(self, done: int) -> None:
        self.conn.request(messages.NegotiateBye(done=done), min(self.timeout, 10.0))

    def abort(self, reason: str) -> None:
        self.conn.request(messages.NegotiateAbort(reason=reason[:60000]),
                          min(self.timeout, 10.0))

    def close(self) -> None:
        self.conn.close()
        self.poll_conn.close()
