"""The job's own rendezvous, the server's side: three commands that rank 0's
in-process aggregator (switch/in_process.py) serves for its job on
NETREDUCE_RENDEZVOUS, which every rank knows before any aggregator answered. The
ranks' side, and what the exchanges decide, is netreduce/worker/rendezvous.py.

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
from typing import Any, Dict, Tuple, Union

from netreduce.protocol import messages
from netreduce.protocol.messages import RvGather, RvRequest, RvWatch
from netreduce.switch.commands import RequestError, register_handler

# A watch that does not say how long it may wait waits this long (ranks say:
# netreduce/worker/rendezvous.py asks for its own WATCH_WAIT_S); 5 s at most.
WATCH_WAIT_S = 1.0


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


def _bind(srv: Any, sess: Any, msg: Union[RvGather, RvRequest, RvWatch]) -> Tuple[str, int, int]:
    job, rank, size = msg.job, msg.rank, msg.size
    if not 0 <= rank < size:
        raise RequestError(f"job '{job}': rank {rank} out of range for world size {size}")
    srv.admit(sess, job, rank, msg.auth)
    return job, rank, size


def _gather(srv: Any, sess: Any, msg: RvGather) -> messages.RvGatherReply:
    job, rank, size = _bind(srv, sess, msg)
    key, wait = msg.key, max(0.0, min(msg.wait, 600.0))
    table = _table(srv)
    with table.cond:
        entry = table.gathers.setdefault((job, key), {"values": {}, "readers": 0})
        posted = entry["values"]
        posted[rank] = msg.value
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
    return messages.RvGatherReply(values=values)


def _request(srv: Any, sess: Any, msg: RvRequest) -> messages.Empty:
    job, rank, _ = _bind(srv, sess, msg)
    gen = msg.gen
    if gen < 0:
        return messages.Empty()  # binds the connection only
    table = _table(srv)
    with table.cond:
        known = table.requests.get(job)
        if known is None or known["gen"] < gen:
            table.requests[job] = {"gen": gen, "reason": msg.reason[:2000], "rank": rank}
            table.cond.notify_all()
    return messages.Empty()


def _watch(srv: Any, sess: Any, msg: RvWatch) -> messages.RvWatchReply:
    job, _, _ = _bind(srv, sess, msg)
    gen = msg.gen
    wait = max(0.0, min(msg.wait, 5.0))
    table = _table(srv)
    with table.cond:
        table.cond.wait_for(lambda: table.requests.get(job, {}).get("gen", -1) >= gen,
                            timeout=wait)
        req = table.requests.get(job)
        if req is not None and req["gen"] >= gen:
            return messages.RvWatchReply(**req)
        return messages.RvWatchReply()


register_handler(RvGather, _gather)
register_handler(RvRequest, _request)
register_handler(RvWatch, _watch)
