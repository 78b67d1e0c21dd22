"""A job's window (docs/protocol.md, *Payload size*): the NETREDUCE_WINDOW every rank
must agree on (chunk c goes to slot c mod window), and, when none set it, the window
fitted with the final payload to the smallest receive buffer a rank reported, to
this daemon's data ports (protocol/socket_buffers.py) and, on the default pool, to
CACHE_WINDOW. Called by switch/server.py's register with its lock held."""
from __future__ import annotations

import logging
from typing import Any

from netreduce.protocol import messages
from netreduce.protocol.socket_buffers import DAEMON_SHARE, rank_share, size_words, slots_that_fit
from netreduce.switch.commands import RequestError

log = logging.getLogger("netreduce.switch")

# The most slots a job's window holds per data thread when no rank set
# NETREDUCE_WINDOW and the operator did not set --slots. A job touches 2 x W x P bytes
# of slot memory (two shadow sets) round after round, W/T slots of it on each of T
# data threads; the default pool's 1462 slots at MTU 1500 (P = 1432) are 4 MiB, twice
# a core's L2 here, so every contribution's sum and the first one's copy missed it.
# 256 slots a thread (716 KiB of slots, 366 KiB in flight per rank with one thread)
# stay in L2 (BENCHMARKS.md, issue 33, aggwin: what it gains at 40 Gbit/s and what it
# costs at 1 Gbit/s on a loaded host). Below P ~ 8 KiB only: MTU 9000's pool is 234.
CACHE_WINDOW = 256


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

def fit(aggregator: Any, job: Any, cap: int = 0) -> None:
    """With the payload final: the window every rank of the job runs with when
    none set NETREDUCE_WINDOW, so that a burst of results fits the smallest
    receive buffer a rank reported, every rank's window at once this daemon's
    data ports (protocol/socket_buffers.py), and `cap` slots per data thread
    (CACHE_WINDOW on the default pool; 0 = none). Lock held."""
    if job.window:
        return
    slots = int(aggregator.job_counters(job.index)["slots"])
    bounds = []  # (slots, why, log level): a capped rank is the operator's to fix
    if cap:
        threads = int(aggregator.threads)
        bounds.append((cap * threads, logging.INFO,
                       f"{cap} slots per data thread ({threads}) keep the job's slot memory "
                       f"in the threads' caches (netreduce-switch --slots sets the window "
                       f"instead)"))
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
