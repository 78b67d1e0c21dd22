"""The job's own rendezvous: small all-gathers among its ranks that do not go
through the aggregator, for the decisions every rank must take alike when the
aggregator refused the job or died (netreduce/failover.py).

Rank 0 serves it: three commands added to the control server that rank 0 runs in
process anyway (netreduce/algorithms/host_fallback.py, LocalAggregator), on
NETREDUCE_RENDEZVOUS, which every rank knows before any aggregator answered.

* ``rv_gather`` {key, value}: waits until every rank of the job has posted a value
  under ``key`` and answers all of them in rank order — one exchange, one decision
  that every rank computes from the same list.
* ``rv_request`` {gen, reason}: some rank saw generation ``gen`` of the job's data
  path fail; ``rv_watch`` {gen} long-polls for that, so that every rank joins the
  recovery, including a rank that is idle or still waiting on a live-looking path.

Each connection proves the job's secret (protocol/auth.py) like a data-plane rank.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from netreduce import config
from netreduce.protocol import auth
from netreduce.protocol.address import format_address
from netreduce.protocol.client import ControlClient
from netreduce.switch.commands import RequestError, register_handler
from netreduce.errors import ControlPlaneError, NetReduceError

WATCH_WAIT_S = 1.0  # one long-poll; the client asks again


class _JobTable:
    """Per server: gathers in progress and the latest failover request per job."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.gathers: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self.requests: Dict[str, Dict[str, Any]] = {}  # job -> {gen, reason, rank}


_tables_lock = threading.Lock()


def _table(srv: Any) -> _JobTable:
    with _tables_lock:
        table = getattr(srv, "_nr_rendezvous", None)
        if table is None:
            table = srv._nr_rendezvous = _JobTable()
        return table


def _bind(srv: Any, sess: Any, msg: Dict[str, Any]) -> Tuple[str, int, int]:
    job, rank, size = str(msg["job"]), int(msg["rank"]), int(msg["size"])
    if not 0 <= rank < size:
        raise RequestError(f"job '{job}': rank {rank} out of range for world size {size}")
    srv.admit(sess, job, rank, msg)
    return job, rank, size


def _gather(srv: Any, sess: Any, msg: Dict[str, Any]) -> Dict[str, Any]:
    job, rank, size = _bind(srv, sess, msg)
    key, wait = str(msg["key"]), max(0.0, min(float(msg.get("wait", 30.0)), 600.0))
    table = _table(srv)
    with table.cond:
        entry = table.gathers.setdefault((job, key), {"values": {}, "readers": 0})
        posted = entry["values"]
        posted[rank] = msg.get("value")
        table.cond.notify_all()
        table.cond.wait_for(lambda: len(posted) >= size, timeout=wait)
        if len(posted) < size:
            missing = sorted(set(range(size)) - set(posted))
            raise RequestError(f"job '{job}': rank(s) {', '.join(map(str, missing))} did not "
                               f"reach the exchange '{key}' within {wait:g} s")
        values = [posted[r] for r in range(size)]
        entry["readers"] += 1
        if entry["readers"] >= size:  # each rank reads once: the last drops the entry
            table.gathers.pop((job, key), None)
    return {"values": values}


def _request(srv: Any, sess: Any, msg: Dict[str, Any]) -> Dict[str, Any]:
    job, rank, _ = _bind(srv, sess, msg)
    gen = int(msg["gen"])
    if gen < 0:
        return {}  # binds the connection only
    table = _table(srv)
    with table.cond:
        known = table.requests.get(job)
        if known is None or known["gen"] < gen:
            table.requests[job] = {"gen": gen, "reason": str(msg.get("reason", ""))[:2000],
                                   "rank": rank}
            table.cond.notify_all()
    return {}


def _watch(srv: Any, sess: Any, msg: Dict[str, Any]) -> Dict[str, Any]:
    job, _, _ = _bind(srv, sess, msg)
    gen = int(msg["gen"])
    wait = max(0.0, min(float(msg.get("wait", WATCH_WAIT_S)), 5.0))
    table = _table(srv)
    with table.cond:
        table.cond.wait_for(lambda: table.requests.get(job, {}).get("gen", -1) >= gen,
                            timeout=wait)
        req = table.requests.get(job)
        return dict(req) if req is not None and req["gen"] >= gen else {}


register_handler("rv_gather", _gather)
register_handler("rv_request", _request)
register_handler("rv_watch", _watch)


class Rendezvous:
    """A rank's side: one connection for exchanges and requests, one for the watch
    (a long-poll must not hold up an exchange)."""

    def __init__(self, address: Tuple[str, int], job: str, rank: int, size: int,
                 timeout: float, connect_for: float = 0.0) -> None:
        self.address, self.job, self.rank, self.size = address, job, rank, size
        self.timeout = timeout
        self._ident = {"job": job, "rank": rank, "size": size}
        self._calls = self._open(connect_for)
        self._watch: Optional[ControlClient] = None

    def _open(self, connect_for: float) -> ControlClient:
        """A proven connection; rank 0 may still be starting its server, so retry
        reaching it for ``connect_for`` seconds."""
        deadline = time.monotonic() + connect_for
        while True:
            try:
                client = ControlClient(self.address, timeout=self.timeout)
                break
            except ControlPlaneError as exc:
                if time.monotonic() >= deadline:
                    raise NetReduceError(
                        f"rank {self.rank} of job '{self.job}': cannot reach the job's "
                        f"rendezvous at {format_address(self.address)} (rank 0 serves it; "
                        f"NETREDUCE_RENDEZVOUS): {exc}") from None
                time.sleep(0.1)
        self._proof = auth.prove(client.call, config.get("NETREDUCE_JOB_SECRET"), self.job,
                                 self.rank)
        client.call("rv_request", gen=-1, **self._ident, **self._proof)  # binds; no request
        return client

    @property
    def local_ip(self) -> str:
        """This host's address on the route to rank 0: where the others reach us."""
        return self._calls._sock.getsockname()[0]

    def gather(self, key: str, value: Any, wait: Optional[float] = None) -> List[Any]:
        wait = self.timeout if wait is None else wait
        try:
            reply = self._calls.call("rv_gather", timeout=wait + 5.0, key=key, value=value,
                                     wait=wait, **self._ident)
        except ControlPlaneError as exc:
            raise NetReduceError(f"rank {self.rank}: the job's rendezvous at "
                                 f"{format_address(self.address)} failed: {exc}") from None
        return list(reply["values"])

    def request(self, gen: int, reason: str) -> None:
        self._calls.call("rv_request", gen=gen, reason=reason, **self._ident)

    def watch(self, gen: int) -> Dict[str, Any]:
        """The failover request for generation >= ``gen``, or {} after a second."""
        if self._watch is None:
            self._watch = ControlClient(self.address, timeout=self.timeout)
            proof = auth.prove(self._watch.call, config.get("NETREDUCE_JOB_SECRET"),
                               self.job, self.rank)
            self._watch.call("rv_request", gen=-1, **self._ident, **proof)
        return self._watch.call("rv_watch", gen=gen, wait=WATCH_WAIT_S,
                                timeout=WATCH_WAIT_S + self.timeout, **self._ident)

    def close(self) -> None:
        self._calls.close()
        if self._watch is not None:
            self._watch.close()
