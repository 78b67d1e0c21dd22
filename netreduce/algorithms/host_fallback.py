"""The host-based all-reduce: the job's own ranks aggregate, no aggregator needed.

What NETREDUCE_FALLBACK=host runs when the aggregator refuses the job, cannot be
reached at start, or dies mid-job without a standby (netreduce/worker/failover.py).

Every rank runs an aggregator in process (netreduce/switch/in_process.py) — the
native aggregator the daemon uses (its own threads, the GIL never involved) plus the
control server that admits ranks to it — and the job's buffers are spread over the
N worker-hosted aggregators with the multi-aggregator algorithm (multi_aggregator.py): range i of
every buffer is summed on rank i's host. Each host then sends about S·(N-1)/N of
its own data out and receives as much of results, and carries as much again for
the range it aggregates — the traffic of a ring all-reduce (reduce-scatter plus
all-gather, 2·S·(N-1)/N per link direction), in one round trip instead of 2·(N-1)
steps, and with the whole per-packet path native. Results are exact and identical
on every rank for the multi-aggregator's reason: each element is summed by one
aggregator and every rank receives that aggregator's bytes.

Rank 0's in-process aggregator also serves the job's negotiation and rendezvous
(netreduce/worker/rendezvous.py) on NETREDUCE_RENDEZVOUS; the others listen on a free port
and announce where through the rendezvous.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Sequence, Tuple

from netreduce.algorithms.multi_aggregator import MultiAggregator
from netreduce.protocol.address import format_address

log = logging.getLogger("netreduce")


def build(addresses: Sequence[Tuple[str, int]], *, job: str, rank: int, size: int,
          connect: Callable[..., Any], connect_kw: Dict[str, Any]) -> MultiAggregator:
    """Rank ``rank``'s connections to every worker-hosted aggregator (rank i's is
    ``addresses[i]``), as one multi-aggregator algorithm. Every rank calls this at
    once."""
    conns: List[Any] = []
    try:
        for address in addresses:
            conns.append(connect(tuple(address), job=job, rank=rank, size=size, **connect_kw))
    except BaseException:
        for c in conns:
            c.close()
        raise
    algo = MultiAggregator(conns)
    algo.name = "host"
    if rank == 0:
        log.info("netreduce: job %s all-reduces among its %d ranks' own aggregators: %s", job,
                 size, ", ".join(format_address(tuple(a)) for a in addresses))
    return algo
