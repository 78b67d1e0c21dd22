"""Jobs whose ranks have not all registered yet: *pending* jobs (issue 35).

A job's first ``register`` takes its pool at once (so admission is decided then), but
only a job whose every rank has registered is *admitted* and counts against
--max-jobs. Pending jobs hold their pools in room the native table keeps beside
--max-jobs (switch/daemon.py builds it with ``Limits.pending_jobs`` more entries),
bounded on their own: at most ``pending_jobs_per_source`` from one source address
(--max-pending-jobs) and ``pending_jobs`` from all, and dropped ``pending_job_s``
after their first rank registered (--pending-job-timeout). So strangers' registrations
that never complete cannot fill the table (switch/limits.py has the numbers). The
server (switch/server.py) keeps ``admitted`` and ``pending_jobs``; these functions
run under its lock but ``sweep``, the event loop's periodic call."""
from __future__ import annotations

import logging
from typing import Any, List, Tuple

from netreduce.protocol.address import parse_address
from netreduce.switch.commands import JOB_FAILURE_HOOKS, RequestError

log = logging.getLogger("netreduce.switch")


def source(sess: Any) -> str:
    """The address a session comes from, without its port."""
    try:
        return parse_address(sess.peer)[0]
    except ValueError:
        return sess.peer


MISSING_SHOWN = 16  # unregistered ranks named in a reply (an error message's worth)


def missing_ranks(job: Any) -> Tuple[List[int], int]:
    """The first MISSING_SHOWN ranks that have not registered, and how many have not:
    every register and payload reply carries them, so at 1,000 ranks the whole list
    (made and encoded per reply) was O(N^2) work for the event loop."""
    shown: List[int] = []
    if len(job.ranks) < job.size:
        for r in range(job.size):
            if r not in job.ranks:
                shown.append(r)
                if len(shown) == MISSING_SHOWN:
                    break
    return shown, job.size - len(job.ranks)


def room_for_new_job(srv: Any, sess: Any, name: str, rank: int, size: int) -> None:
    """A job's first rank: refused when --max-jobs jobs are admitted, or when its
    source (or all sources) hold as many pending jobs as they may (a job of one
    rank is complete at once: never pending). Lock held."""
    if len(srv.admitted) >= srv.max_jobs:
        srv.refused["max_jobs"] += 1
        raise RequestError(f"job '{name}' (rank {rank}) refused: aggregator full: "
                           f"--max-jobs {srv.max_jobs} jobs already admitted")
    if size == 1:
        return
    limits, where = srv.limits, source(sess)
    mine = sum(1 for j in srv.pending_jobs.values() if j.source == where)
    why = ""
    if mine >= limits.pending_jobs_per_source:
        why = (f"{mine} jobs registered from {where} still wait for their other ranks "
               f"(at most {limits.pending_jobs_per_source} per source address, "
               "--max-pending-jobs")
    elif len(srv.pending_jobs) >= limits.pending_jobs:
        why = (f"{len(srv.pending_jobs)} jobs still wait for their other ranks (at most "
               f"{limits.pending_jobs} from all sources")
    if why:
        srv.refused["pending"] += 1
        raise RequestError(f"job '{name}' (rank {rank}) refused: {why}; each is dropped "
                           f"{limits.pending_job_s:g} s after its first rank registered, "
                           "--pending-job-timeout)")

def room_for_admitted(srv: Any, name: str) -> None:
    """A job admitted whole at once (a rack's part, switch/uplink.py): refused when
    --max-jobs jobs are admitted. Lock held."""
    if len(srv.admitted) >= srv.max_jobs:
        srv.refused["max_jobs"] += 1
        raise RequestError(f"job '{name}' refused: aggregator full: --max-jobs "
                           f"{srv.max_jobs} jobs already admitted")

def sweep(srv: Any, now: float) -> None:
    """The event loop, a few times a second: drop the pending jobs whose ranks have
    not all registered within pending_job_s. The pool is freed at once; the ranks'
    requests are answered with why (a payload wait at once) for pending_idle_s
    more, then their connections close."""
    expired, grace = [], now + srv.limits.pending_idle_s
    with srv.lock:
        for job in list(srv.pending_jobs.values()):
            if job.failure or now - job.created < srv.limits.pending_job_s:
                continue
            missing, count = missing_ranks(job)
            shown = ", ".join(map(str, missing)) + (
                f" and {count - len(missing)} more" if count > len(missing) else "")
            job.failure = (f"job '{job.name}': rank(s) {shown} did not register within "
                           f"{srv.limits.pending_job_s:g} s of its first rank "
                           f"(--pending-job-timeout); this run of the job is dropped")
            job.closing = True
            srv.closing_later += [(grace, s.conn) for s in job.ranks.values() if s.conn]
            job.ranks.clear()  # their release finds nothing more to free
            del srv.pending_jobs[id(job)]
            if srv.jobs.get(job.name) is job:
                del srv.jobs[job.name]
            srv.aggregator.remove_job(job.index)
            expired.append(job)
        if expired:
            srv.payload_topic.notify()
    for job in expired:
        log.warning("%s (first registered from %s; pool %d freed)", job.failure, job.source,
                    job.index)
        for hook in JOB_FAILURE_HOOKS:
            hook(srv, job.name, job.failure)
    while srv.closing_later and srv.closing_later[0][0] <= now:
        srv.loop.close_after_write(srv.closing_later.pop(0)[1])
