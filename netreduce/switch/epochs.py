"""Membership epochs: an elastic job resized in place at the aggregator.

An elastic job (netreduce-run's elastic driver, docs/elastic.md) numbers each of its
memberships — who its ranks are, and how many — with an epoch, 1, 2, 3, ... Every
rank names its epoch when it registers (``register``) and says hello to the
coordinator (``negotiate_hello``). At the aggregator, for one job name:

* a rank of the job's current epoch joins the current run;
* a rank of a later epoch moves the job there: the current run ends at once (its
  slot pool is freed, ranks still bound to it are stale and learn so at their next
  request, their negotiation fails with a message naming the new epoch), and the
  job's next run is admitted with the new world size — its own index, pool and key,
  its sequence numbers from 0. Other jobs are not touched, nothing restarts;
* a rank of an earlier epoch is refused, naming both epochs.

Why a new run rather than the old pool re-sized: the key is drawn afresh, so a
packet of the old membership — a resend still in the network, a stale rank — fails
the key check and can never add into a slot of the new one (native
Aggregator::HandleDatagram drops it as ``drop_key``, or ``unknown_job`` once the
index is free), whatever the loss; and the new run's slot state starts clean, with
no round of the old world size half summed. Freeing the old pool first keeps a full
daemon (``--max-jobs``, ``--memory-mb``) from refusing the resize.

A job without epochs (0, every non-elastic rank) keeps the restart rule of
server.py: once a rank has left, a register starts the next run.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any, Optional, Tuple

from netreduce.switch.commands import RequestError

log = logging.getLogger("netreduce.switch")


def of(msg: Any, name: str, rank: int) -> int:
    """The epoch a request names (0 when it names none): a messages.Register or
    NegotiateHello (the schema has checked it), or a plain dict."""
    raw = msg.get("epoch", 0) if isinstance(msg, dict) else msg.epoch
    try:
        epoch = int(raw or 0)
    except (TypeError, ValueError):
        raise RequestError(f"job '{name}' (rank {rank}): epoch must be an integer, "
                           f"got {raw!r}") from None
    if isinstance(raw, bool) or epoch < 0:
        raise RequestError(f"job '{name}' (rank {rank}): epoch must be a non-negative "
                           f"integer, got {raw!r}")
    return epoch


def stale(name: str, rank: int, epoch: int, current: int) -> RequestError:
    return RequestError(
        f"job '{name}': rank {rank} belongs to membership epoch {epoch}, but the job has "
        f"moved on to epoch {current}; this rank is no longer a member (its elastic "
        "driver assigns it a place in the current epoch, or none)")


# Runs remembered per name after their record is gone (the usual case: every rank of
# epoch E left before epoch E+1 registered), so that a resize still logs "world size
# 4 -> 2" and counts; the most recent names only.
HISTORY = 1024


@dataclasses.dataclass(frozen=True)
class Past:
    epoch: int
    size: int
    index: int
    resizes: int


def _history(srv: Any) -> "collections.OrderedDict[str, Past]":
    table = getattr(srv, "_nr_epochs", None)
    if table is None:
        table = srv._nr_epochs = collections.OrderedDict()
    return table


def settle(srv: Any, name: str, job: Optional[Any], epoch: int,
           rank: int) -> Tuple[Optional[Any], Optional[Past]]:
    """The run a rank of ``epoch`` joins, and the run the job had before: (``job``,
    None) at the same epoch; (None, the run it replaces) when ``epoch`` is later, after
    ending a live ``job`` (the caller admits the next run). Lock held."""
    past = _history(srv).get(name)
    current = job.epoch if job is not None else (past.epoch if past else 0)
    if epoch < current:
        raise stale(name, rank, epoch, current)
    if job is not None and epoch == job.epoch:
        return job, None
    if job is not None:
        end_run(srv, job, epoch)
        past = _history(srv).get(name)
    return None, past if past is not None and past.epoch < epoch else None


def end_run(srv: Any, job: Any, epoch: int) -> None:
    """End ``job``'s run because the job moved to ``epoch``: free its pool now. Lock held."""
    stale_ranks = sorted(job.ranks)
    job.ranks.clear()  # their release finds nothing of theirs: the pool is gone already
    job.closing = True
    job.extra["superseded_by"] = epoch
    if srv.jobs.get(job.name) is job:
        del srv.jobs[job.name]
    srv.admitted.pop(id(job), None)       # its pool is no longer held (--max-jobs)
    srv.pending_jobs.pop(id(job), None)
    srv.payload_topic.notify()
    try:
        srv.aggregator.remove_job(job.index)
    except (ValueError, RuntimeError):  # freed already (its last rank left)
        pass
    log.info("job '%s': membership epoch %d -> %d: run of world size %d (index %d) ended%s",
             job.name, job.epoch, epoch, job.size, job.index,
             f", ranks {stale_ranks} still bound to it are stale" if stale_ranks else "")


def admitted(srv: Any, job: Any, past: Optional[Past]) -> None:
    """Log a new run, count a resize, remember the run. Lock held."""
    if not job.epoch:
        log.info("job '%s' admitted: index %d, world size %d", job.name, job.index, job.size)
        return
    history = _history(srv)
    if past is None:
        log.info("job '%s' admitted: index %d, world size %d, membership epoch %d",
                 job.name, job.index, job.size, job.epoch)
    else:
        job.resizes = past.resizes + 1
        srv.epoch_moves = getattr(srv, "epoch_moves", 0) + 1
        log.info("job '%s' resized at membership epoch %d (was %d): world size %d -> %d, "
                 "index %d -> %d (resize %d of this job)", job.name, job.epoch, past.epoch,
                 past.size, job.size, past.index, job.index, job.resizes)
    history[job.name] = Past(job.epoch, job.size, job.index, job.resizes)
    history.move_to_end(job.name)
    while len(history) > HISTORY:
        history.popitem(last=False)
