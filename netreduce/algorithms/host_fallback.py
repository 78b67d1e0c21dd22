"""The host-based all-reduce: the job's own ranks aggregate, no aggregator needed.

What NETREDUCE_FALLBACK=host runs when the aggregator refuses the job, cannot be
reached at start, or dies mid-job without a standby (netreduce/failover.py).

Every rank runs a LocalAggregator in process — the native aggregator the daemon
uses (its own threads, the GIL never involved) plus the control server that
admits ranks to it — and the job's buffers are spread over the N worker-hosted
aggregators with the multi-aggregator algorithm (multi_aggregator.py): range i of
every buffer is summed on rank i's host. Each host then sends about S·(N-1)/N of
its own data out and receives as much of results, and carries as much again for
the range it aggregates — the traffic of a ring all-reduce (reduce-scatter plus
all-gather, 2·S·(N-1)/N per link direction), in one round trip instead of 2·(N-1)
steps, and with the whole per-packet path native. Results are exact and identical
on every rank for the multi-aggregator's reason: each element is summed by one
aggregator and every rank receives that aggregator's bytes.

Rank 0's LocalAggregator also serves the job's negotiation and rendezvous
(rendezvous.py) on NETREDUCE_RENDEZVOUS; the others listen on a free port and
announce where through the rendezvous.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Sequence, Tuple

from netreduce.algorithms.multi_aggregator import MultiAggregator
from netreduce.protocol.address import format_address
from netreduce.errors import NetReduceError

log = logging.getLogger("netreduce")
# Slot memory of one worker-hosted aggregator: its job only (and the next run's pool
# while the previous one drains), so much less than a shared daemon's 1 GiB.
LOCAL_MEMORY = 256 << 20
LOCAL_MAX_JOBS = 4


class LocalAggregator:
    """The native aggregator and its control server, inside this process."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0, secret_required: bool = False,
                 slots: int = 32) -> None:
        from netreduce import _native
        from netreduce.switch import coordinator  # noqa: F401  registers its commands
        from netreduce import rendezvous  # noqa: F401  registers rv_gather / rv_watch
        from netreduce.protocol.auth import Guard
        from netreduce.switch.server import ControlServer
        from netreduce.process import free_tcp_port
        attempts = 20 if port == 0 else 1
        last: Exception = NetReduceError("no attempt")
        for _ in range(attempts):
            chosen = port or free_tcp_port()
            agg = _native.Aggregator(host, chosen, slots, _native.MAX_PAYLOAD, LOCAL_MAX_JOBS, 1,
                                     LOCAL_MEMORY, False, "239.78.0.0")
            try:
                agg.start()
                srv = ControlServer(host, chosen, agg, guard=Guard(require_secret=secret_required))
                break
            except Exception as exc:  # the UDP or TCP port is taken: another one
                last = exc
                try:
                    agg.stop()
                except Exception:
                    pass
        else:
            raise NetReduceError(f"cannot start this rank's aggregator on {host}:{port}: {last}")
        self.aggregator, self.server, self.port = agg, srv, chosen
        self._thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="netreduce-local-aggregator", daemon=True)
        self._thread.start()

    def publish(self, algorithm: Any, metrics_at: str = "") -> None:
        """Rank 0: answer `job_status` for the job and serve its metrics
        (netreduce/job_status.py) until stop()."""
        from netreduce.job_status import Published
        self.published = Published(self.server, algorithm, metrics_at)

    def stop(self) -> None:
        published, self.published = getattr(self, "published", None), None
        if published is not None:
            published.close()
        srv, self.server = self.server, None
        if srv is None:
            return
        srv.shutdown()
        srv.server_close()
        self.aggregator.stop()


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
