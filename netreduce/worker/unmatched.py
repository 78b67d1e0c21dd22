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
from typing import Any, List, Optional

from netreduce.errors import NegotiationError
from netreduce.worker import timeline as tl


def _waiting(comm: Any) -> List[Any]:
    """Tensors without a log entry that may time out (caller holds comm._lock)."""
    return [t for t in comm._inflight.values() if t.seq < 0 and t.kind != "join"
            and comm._last_reply_us > t.t_sent > 0]


def next_deadline(comm: Any) -> Optional[float]:
    """Seconds until the oldest such tensor reaches NETREDUCE_TIMEOUT (None: none)."""
    with comm._lock:
        if comm._failure is not None:
            return None
        oldest = min((t.t_submit for t in _waiting(comm)), default=None)
    if oldest is None:
        return None
    return oldest / 1e6 + comm.timeout_s - time.time()


def expired(comm: Any) -> Optional[NegotiationError]:
    """The error for the oldest tensor past NETREDUCE_TIMEOUT, if there is one."""
    now_us = tl.now_us()
    with comm._lock:
        if comm._failure is not None:
            return None
        late = [t for t in _waiting(comm) if now_us - t.t_submit >= comm.timeout_s * 1e6]
    if not late:
        return None
    t = min(late, key=lambda x: x.t_submit)
    missing = comm._missing.get(t.name)
    who = (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
           if missing else "some ranks")
    kind = "allgather" if t.kind == "allgatherv" else t.kind
    return NegotiationError(
        f"rank {comm.rank}: {kind} of tensor '{t.name}' was not submitted by {who} of "
        f"job '{comm.job}' within NETREDUCE_TIMEOUT={comm.timeout_s:g} s (are they "
        "waiting in a different collective? every rank must submit the same "
        "collectives and names); the job is stopped")
