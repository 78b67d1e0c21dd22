"""The aggregator daemon, netreduce-switch: the native aggregator's control port
(admission, the negotiation coordinator, two-level trees, verbs peers, counters,
signals, Prometheus metrics) and the same aggregator run inside a rank's process
for the host fallback and the job's own rendezvous. It never imports the worker's
code (netreduce/worker); both speak netreduce/protocol.

``spawn`` starts the daemon as a child process and returns once it listens."""
from __future__ import annotations

from typing import Optional, Sequence

from netreduce.switch.child import (DEFAULT_PORT, METRICS_PREFIX, READY_PREFIX,  # noqa: F401
                                    SwitchProcess, spawn, spawn_for_job)

__all__ = ["main", "spawn", "spawn_for_job", "SwitchProcess", "READY_PREFIX", "METRICS_PREFIX",
           "DEFAULT_PORT"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The netreduce-switch command (setup.py's console script). The daemon's modules
    load here, not with the package: a rank that only spawn()s one, or hosts one in
    process, does not load (nor register the commands of) the daemon's own."""
    from netreduce.switch import daemon
    return daemon.main(argv)
