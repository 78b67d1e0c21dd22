"""Tensors that some ranks never submit: the communicator's negotiation timeout.

A collective that only some ranks call (rank 0 in an all-gather while rank 1 waits
in barrier()) would otherwise leave both sides waiting for each other for ever.
Once a tensor has waited NETREDUCE_TIMEOUT for its log entry, and the aggregator
has answered since it went out (a silent aggregator is the ControlPlaneError's
case, not this one), the job is stopped with an error that names the tensor and
the ranks that did not submit it (from the aggregator's stall report, which the
communicator asks for at 3/4 of the timeout). join() is exempt: a joined rank
legitimately waits for the others to run out of data.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, List, Optional

from netreduce.errors import NegotiationError


def waiting(inflight: Iterable[Any], last_reply_us: float) -> List[Any]:
    """Of the tensors in flight, those without a log entry that may time out: sent
    before the aggregator last answered (``last_reply_us``), join() exempt. The
    communicator calls it under its lock."""
    return [t for t in inflight if t.seq < 0 and t.kind != "join"
            and last_reply_us > t.t_sent > 0]


def next_deadline(waiting: List[Any], timeout_s: float) -> Optional[float]:
    """Seconds until the oldest of ``waiting`` reaches NETREDUCE_TIMEOUT (None: none)."""
    oldest = min((t.t_submit for t in waiting), default=None)
    if oldest is None:
        return None
    return oldest / 1e6 + timeout_s - time.time()


def expired(waiting: List[Any], now_us: float, timeout_s: float) -> Optional[Any]:
    """The oldest of ``waiting`` past NETREDUCE_TIMEOUT at ``now_us``, if there is one."""
    late = [t for t in waiting if now_us - t.t_submit >= timeout_s * 1e6]
    return min(late, key=lambda x: x.t_submit) if late else None


def error(t: Any, missing: Optional[List[int]], rank: int, job: str,
          timeout_s: float) -> NegotiationError:
    """The job-stopping error for tensor ``t``, naming the ranks that did not submit it
    (``missing``: the aggregator's last stall report for it)."""
    who = (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
           if missing else "some ranks")
    kind = "allgather" if t.kind == "allgatherv" else t.kind
    return NegotiationError(
        f"rank {rank}: {kind} of tensor '{t.name}' was not submitted by {who} of "
        f"job '{job}' within NETREDUCE_TIMEOUT={timeout_s:g} s (are they "
        "waiting in a different collective? every rank must submit the same "
        "collectives and names); the job is stopped")
