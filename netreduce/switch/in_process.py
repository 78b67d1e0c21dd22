"""An aggregator inside a rank's process: the native aggregator the daemon uses
(its own threads; the GIL is never involved) and the control server that admits
ranks to it, on a thread of the rank.

What a job with failover (netreduce/worker/job_paths.py, which gets this class from
netreduce.api: the worker never imports the daemon) runs: rank 0's serves the job's
negotiation, its rendezvous (switch/rendezvous.py) and its status
(switch/job_status.py) on NETREDUCE_RENDEZVOUS; with NETREDUCE_FALLBACK=host every
rank's aggregates its range of every buffer (netreduce/algorithms/host_fallback.py).
"""
from __future__ import annotations

import threading
from typing import Any, Optional

from netreduce import _native
from netreduce.errors import NetReduceError
from netreduce.process import free_tcp_port
from netreduce.protocol import tls
from netreduce.protocol.auth import Guard
from netreduce.switch import coordinator, rendezvous  # noqa: F401  (their commands register)
from netreduce.switch.job_status import Published
from netreduce.switch.server import ControlServer
from netreduce.switch.settings import DEFAULTS, aggregator_args

# Slot memory of one worker-hosted aggregator: its job only (and the next run's pool
# while the previous one drains), so much less than a shared daemon's 1 GiB.
LOCAL_MEMORY = 256 << 20
LOCAL_MAX_JOBS = 4


class LocalAggregator:
    """The native aggregator and its control server, inside this process."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0, secret_required: bool = False,
                 slots: int = DEFAULTS["slots"]) -> None:
        attempts = 20 if port == 0 else 1
        last: Exception = NetReduceError("no attempt")
        context = tls.job_server_context()  # NETREDUCE_TLS_CERT: serve the job's TLS
        for _ in range(attempts):
            chosen = port or free_tcp_port()
            agg = _native.Aggregator(**aggregator_args(host=host, port=chosen, slots=slots,
                                                       max_jobs=LOCAL_MAX_JOBS,
                                                       memory_limit=LOCAL_MEMORY))
            try:
                agg.start()
                srv = ControlServer(host, chosen, agg, guard=Guard(require_secret=secret_required),
                                    tls=context)
                break
            except Exception as exc:  # the UDP or TCP port is taken: another one
                last = exc
                try:
                    agg.stop()
                except Exception:
                    pass
        else:
            raise NetReduceError(f"cannot start this rank's aggregator on {host}:{port}: {last}")
        self.aggregator, self.port = agg, chosen
        self.server: Optional[ControlServer] = srv
        self.published: Optional[Published] = None
        self._thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="netreduce-local-aggregator", daemon=True)
        self._thread.start()

    def publish(self, algorithm: Any, metrics_at: str = "") -> None:
        """Rank 0: answer `job_status` for the job and serve its metrics
        (switch/job_status.py) until stop()."""
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
