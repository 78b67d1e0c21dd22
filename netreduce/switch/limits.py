"""What one control connection may cost the aggregator daemon (docs/operations.md,
Security): request sizes, how long a connection may stay silent before it belongs to
a job, how many such connections are kept at once, and how many jobs whose ranks have
not all registered yet (pending jobs) a source may hold, and for how long."""
from __future__ import annotations

import dataclasses
import socket
import threading
from typing import Any, Dict, Optional


@dataclasses.dataclass
class Limits:
    """What one connection may cost the daemon (docs/operations.md, Security)."""
    line_bytes: int = 16 << 20          # longest request of a connection bound to a job
    pending_line_bytes: int = 64 << 10  # ... of one that is not (yet)
    pending_idle_s: float = 30.0        # silence that closes a connection not bound to a job
    max_pending: int = 1024             # such connections at once; a new one closes the oldest
    # Jobs admitted at once (--max-jobs): only jobs whose every rank has registered
    # count; None: the native aggregator's table (a server built without the daemon).
    max_jobs: Optional[int] = None
    # Pending jobs (a first rank registered, not every rank yet): each holds its pool
    # provisionally, in room the aggregator keeps beside --max-jobs.
    pending_jobs: int = 64              # from all sources at once
    pending_jobs_per_source: int = 4    # from one source address at once (--max-pending-jobs)
    pending_job_s: float = 300.0        # then the job is dropped (--pending-job-timeout)
    # A finished job's last counters stay readable (counters, metrics) this long
    # (--finished-job-s; switch/finished.py): two of Prometheus' default scrape intervals.
    finished_job_s: float = 120.0


class PendingConnections:
    """Connections that belong to no job (nor the operator) yet. At most ``limit``:
    past that, a new connection shuts the oldest one down, so that idle or half-open
    connections by the thousand never pin threads and memory, while a rank's
    connection, which sends its register/hello at once, gets through."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._lock = threading.Lock()
        self._conns: "Dict[int, tuple]" = {}  # insertion order = age
        self._settled: set = set()
        self.evicted = 0

    def add(self, sess: Any, sock: socket.socket) -> None:
        victims = []
        with self._lock:
            self._conns[id(sess)] = (sess, sock)
            while len(self._conns) > self.limit:
                oldest = next(iter(self._conns))
                victims.append(self._conns.pop(oldest)[1])
                self.evicted += 1
        for victim in victims:
            try:
                victim.shutdown(socket.SHUT_RDWR)  # its thread's read returns at once
            except OSError:
                pass

    def settle(self, sess: Any) -> None:
        with self._lock:
            self._conns.pop(id(sess), None)
            self._settled.add(id(sess))

    def is_settled(self, sess: Any) -> bool:
        with self._lock:
            return id(sess) in self._settled

    def discard(self, sess: Any) -> None:
        with self._lock:
            self._conns.pop(id(sess), None)
            self._settled.discard(id(sess))

    def __len__(self) -> int:
        with self._lock:
            return len(self._conns)
