"""A job's window (docs/protocol.md, *Payload size*): the NETREDUCE_WINDOW every rank
must agree on (chunk c goes to slot c mod window), and, when none set it, the window
fitted with the final payload to the smallest receive buffer a rank reported and to
this daemon's data ports (protocol/socket_buffers.py). Called by switch/server.py's
register with its lock held."""
from __future__ import annotations

import logging
from typing import Any

from netreduce.protocol import messages
from netreduce.protocol.socket_buffers import DAEMON_SHARE, rank_share, size_words, slots_that_fit
from netreduce.switch.commands import RequestError

log = logging.getLogger("netreduce.switch")


def agree(job: Any, name: str, rank: int, msg: messages.Register) -> None:
    """Every rank of a job must use the same NETREDUCE_WINDOW (chunk c goes to slot
    c mod window): refuse the rank whose window differs from the first one's."""
    window = msg.window
    if window is None:  # a client that does not say (raw tests)
        return
    if window < 0:
        raise RequestError(f"job '{name}': rank {rank}: NETREDUCE_WINDOW={window} is "
                           f"negative (0 = all the slots the aggregator grants)")
    if job.window is None:
        job.window, job.window_by = window, rank
    elif window != job.window:
        raise RequestError(
            f"job '{name}': rank {rank} has NETREDUCE_WINDOW={window}, but rank "
            f"{job.window_by} has NETREDUCE_WINDOW={job.window}; a chunk's slot follows "
            f"the window, so set it the same on every rank (0 = all the slots)")

def fit(aggregator: Any, job: Any) -> None:
    """With the payload final: the window every rank of the job runs with when
    none set NETREDUCE_WINDOW, so that a burst of results fits the smallest
    receive buffer a rank reported, and every rank's window at once this daemon's
    data ports (protocol/socket_buffers.py). Lock held."""
    if job.window:
        return
    slots = int(aggregator.job_counters(job.index)["slots"])
    bounds = []  # (slots, why, log level): a capped rank is the operator's to fix
    for coalesced, (buffer, rank) in job.receive_buffers.items():
        share = rank_share(coalesced, job.payload_bytes)
        bounds.append((slots_that_fit(buffer, job.payload_bytes, share), logging.WARNING,
                       f"rank {rank}'s UDP receive buffer holds {size_words(buffer / 2)} "
                       f"(net.core.rmem_max caps it without CAP_NET_ADMIN; raise it on "
                       f"that host for the full window)"))
    own = _receive_buffer(aggregator)
    if own:  # slots are spread over the data threads, one socket each
        share = own * int(aggregator.threads) // job.size
        bounds.append((slots_that_fit(share, job.payload_bytes, DAEMON_SHARE), logging.INFO,
                       f"this daemon's data ports hold {size_words(own / 2)} each, "
                       f"shared by {job.size} ranks' windows"))
    fits = [b for b in bounds if 0 < b[0] < slots]
    if fits:
        fit, level, why = min(fits)
        job.window_fit = fit
        log.log(level, "job '%s': window %d of %d slots: %s", job.name, fit, slots, why)

def _receive_buffer(aggregator: Any) -> int:
    """The smallest data socket's SO_RCVBUF (read back); 0 when unknown."""
    if not hasattr(aggregator, "transport_info"):
        return 0
    return int(aggregator.transport_info().get("receive_buffer_bytes", 0))
