"""Finished jobs' last counters, kept a while (``--finished-job-s``).

When a job's last rank leaves, the aggregator frees its pool and its native counters
with it. An operator's scrape that comes after that, or a rank that reads its job's
counters after it left (a test, a launcher's summary), would find nothing: the
increments since the last scrape were lost. So the control server keeps each
finished job's counters as they were when its pool was freed, marked ``finished``,
for ``Limits.finished_job_s`` seconds (at most ``MAX_KEPT`` jobs, the oldest dropped
first); ``counters`` and the metrics show them beside the live jobs, until a new run
of the same name is admitted or the time is up. Who may read one is decided as for a
live job: the operator, anyone for a job admitted without a secret, otherwise only a
connection bound to the job with the same secret."""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterator, Optional, Tuple

MAX_KEPT = 1024


class FinishedJobs:
    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._lock = threading.Lock()
        # name -> (monotonic deadline, the counters' view, the job's public key or None)
        self._jobs: Dict[str, Tuple[float, Dict[str, Any], Optional[str]]] = {}

    def keep(self, name: str, view: Dict[str, Any], pub: Optional[str]) -> None:
        """The last counters of job ``name``, whose pool is being freed; ``pub`` the
        public key of its secret (None: admitted without one)."""
        if self.keep_s <= 0:
            return
        kept = dict(view, finished=True, ranks=[], finished_at=round(time.time(), 3))
        with self._lock:
            self._jobs.pop(name, None)  # a re-kept name goes to the end of the age order
            self._jobs[name] = (time.monotonic() + self.keep_s, kept, pub)
            while len(self._jobs) > MAX_KEPT:
                del self._jobs[next(iter(self._jobs))]

    def forget(self, name: str) -> None:
        """A new run of ``name`` was admitted: its counters start again."""
        with self._lock:
            self._jobs.pop(name, None)

    def current(self) -> Iterator[Tuple[str, Dict[str, Any], Optional[str]]]:
        """(name, view, pub) of every job still kept; the expired ones are dropped."""
        now = time.monotonic()
        with self._lock:
            for name in [n for n, (due, _, _) in self._jobs.items() if due <= now]:
                del self._jobs[name]
            items = [(name, dict(view), pub) for name, (_, view, pub) in self._jobs.items()]
        return iter(items)
