"""The job's own rendezvous, a rank's side: small all-gathers among the job's ranks
that do not go through the aggregator, for the decisions every rank must take alike
when the aggregator refused the job or died (netreduce/worker/failover.py).

Rank 0 serves it on NETREDUCE_RENDEZVOUS, which every rank knows before any
aggregator answered: three commands of the control server that rank 0 runs in
process anyway (netreduce/switch/rendezvous.py has them and their messages). Each
connection proves the job's secret (protocol/auth.py) like a data-plane rank.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from netreduce import config
from netreduce.errors import ControlPlaneError, NetReduceError
from netreduce.protocol import auth, codec, messages
from netreduce.protocol.address import format_address, parse_address
from netreduce.protocol.client import ControlConnection

WATCH_WAIT_S = 1.0  # one long-poll; the client asks again


def rendezvous_address(knobs: Dict[str, Any]) -> Tuple[str, int]:
    """NETREDUCE_RENDEZVOUS, else MASTER_ADDR:MASTER_PORT+1 from the launcher."""
    text = knobs.get("NETREDUCE_RENDEZVOUS") or ""
    if text:
        return parse_address(text, what="NETREDUCE_RENDEZVOUS")
    env = config.launcher_environment()
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT", "").isdigit():
        return env["MASTER_ADDR"], int(env["MASTER_PORT"]) + 1
    raise NetReduceError(
        "NETREDUCE_FALLBACK=host and NETREDUCE_STANDBY_SWITCH need a rendezvous that does "
        "not go through the aggregator: set NETREDUCE_RENDEZVOUS=HOST:PORT (rank 0's host, a "
        "free port) on every rank, or launch with MASTER_ADDR/MASTER_PORT set (netreduce-run, "
        "torchrun)")


class Rendezvous:
    """A rank's side: one connection for exchanges and requests, one for the watch
    (a long-poll must not hold up an exchange)."""

    def __init__(self, address: Tuple[str, int], job: str, rank: int, size: int,
                 timeout: float, connect_for: float = 0.0) -> None:
        self.address, self.job, self.rank, self.size = address, job, rank, size
        self.timeout = timeout
        self._ident = {"job": job, "rank": rank, "size": size}
        self._calls = self._open(connect_for)
        self._watch: Optional[ControlConnection] = None

    def _open(self, connect_for: float) -> ControlConnection:
        """A proven connection; rank 0 may still be starting its server, so retry
        reaching it for ``connect_for`` seconds."""
        deadline = time.monotonic() + connect_for
        while True:
            try:
                client = ControlConnection(self.address, timeout=self.timeout)
                break
            except ControlPlaneError as exc:
                if time.monotonic() >= deadline:
                    raise NetReduceError(
                        f"rank {self.rank} of job '{self.job}': cannot reach the job's "
                        f"rendezvous at {format_address(self.address)} (rank 0 serves it; "
                        f"NETREDUCE_RENDEZVOUS): {exc}") from None
                time.sleep(0.1)
        self._bind(client)
        return client

    def _bind(self, client: ControlConnection) -> None:
        """Prove the job's secret on ``client``: an rv_request of no generation."""
        proof = auth.prove_on(client, auth.job_secret(), self.job, self.rank)
        client.request(messages.RvRequest(gen=-1, auth=proof, **self._ident))

    @property
    def local_ip(self) -> str:
        """This host's address on the route to rank 0: where the others reach us."""
        return self._calls.sock.getsockname()[0]

    def gather(self, key: str, value: Any, wait: Optional[float] = None) -> List[Any]:
        wait = self.timeout if wait is None else wait
        try:
            reply = self._calls.request(messages.RvGather(key=key, value=value, wait=wait,
                                                          **self._ident), timeout=wait + 5.0)
        except ControlPlaneError as exc:
            raise NetReduceError(f"rank {self.rank}: the job's rendezvous at "
                                 f"{format_address(self.address)} failed: {exc}") from None
        return list(reply.values)

    def request(self, gen: int, reason: str) -> None:
        self._calls.request(messages.RvRequest(gen=gen, reason=reason, **self._ident))

    def watch(self, gen: int) -> Dict[str, Any]:
        """The failover request for generation >= ``gen``, or {} after a second."""
        if self._watch is None:
            self._watch = ControlConnection(self.address, timeout=self.timeout)
            self._bind(self._watch)
        reply = self._watch.request(messages.RvWatch(gen=gen, wait=WATCH_WAIT_S, **self._ident),
                                    timeout=WATCH_WAIT_S + self.timeout)
        return {} if reply.gen < 0 else codec.to_builtins(reply)

    def close(self) -> None:
        self._calls.close()
        if self._watch is not None:
            self._watch.close()
