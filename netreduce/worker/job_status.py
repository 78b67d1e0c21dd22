"""Where an operator sees what a job with failover runs on now (docs/failover.md).

An aggregator that cannot be reached cannot count a job that went on without it,
so the job says it itself. Rank 0 of a job started with failover serves the job's
rendezvous (job_paths.start); there it also answers ``job_status`` and, with
NETREDUCE_JOB_METRICS, serves Prometheus metrics (netreduce/switch/job_status.py).
``query`` is the asking side: ``netreduce info`` asks at NETREDUCE_RENDEZVOUS (or
MASTER_ADDR:MASTER_PORT+1), proving NETREDUCE_JOB_SECRET when the job has one.

An aggregator that refused the job but is reachable counts that itself
(``netreduce_switch_jobs_refused_total``); rank 0 also tells it that the job went on
elsewhere (``fell_back``), which it counts as ``netreduce_switch_jobs_fell_back_total``.
"""
from __future__ import annotations

import logging
from typing import Any, Dict

from netreduce.errors import NetReduceError
from netreduce.protocol import auth, messages
from netreduce.protocol.address import format_address
from netreduce.protocol.client import ControlConnection
from netreduce.worker.rendezvous import rendezvous_address

log = logging.getLogger("netreduce")


def query(knobs: Dict[str, Any], job: str, secret: str, timeout: float = 2.0) -> Dict[str, Any]:
    """For `netreduce info`: the job's status from its rendezvous, or why not."""
    try:
        address = rendezvous_address(knobs)
    except (NetReduceError, ValueError) as exc:
        return {"error": str(exc)}
    out: Dict[str, Any] = {"rendezvous": format_address(address)}
    try:
        with ControlConnection(address, timeout=timeout) as client:
            proof = auth.prove_on(client, secret, job, -1)
            out.update(client.request(messages.JobStatus(job=job, rank=-1, auth=proof)).status)
    except NetReduceError as exc:
        out["error"] = f"no answer from job '{job}' at its rendezvous: {exc}"
    return out


def describe(status: Dict[str, Any]) -> str:
    """One line of `netreduce info`."""
    if "error" in status:
        return status["error"]
    words = [f"job '{status['job']}' runs on {status['path']}"]
    if status["degraded"]:
        words.append("DEGRADED (no aggregator)")
    elif not status["on_primary"]:
        words.append("(a standby)")
    if status["start_reasons"]:
        words.append("; did not start on its first path: " + " | ".join(status["start_reasons"]))
    if status["failovers"]:
        last = status["history"][-1]
        words.append(f"; {status['failovers']} failover(s), last from {last['from']}: "
                     f"{last['reason']}")
    return " ".join(words).replace(" ;", ";")


def refusal_reason(text: str) -> str:
    """The daemon's refusal counters' reason for a candidate's failure text."""
    if "slot memory exhausted" in text:
        return "memory"
    if "--max-jobs" in text or "aggregator full" in text:
        return "max_jobs"
    if "cannot reach" in text or "closed the control connection" in text:
        return "unreachable"
    return "other"


def report_fell_back(cand: Any, reason_text: str, job: str, to: str) -> None:
    """Rank 0, after the job went on without the aggregators of ``cand`` (refused or
    unreachable): tell those that answer now, so that they count it. Best effort,
    one second per aggregator at most."""
    if cand.kind != "switch":
        return
    reason = refusal_reason(reason_text)
    for address in cand.addresses:
        try:
            with ControlConnection(tuple(address), timeout=1.0) as client:
                client.request(messages.FellBack(reason=reason, to=to), timeout=1.0)
        except NetReduceError as exc:  # unreachable, or an older daemon
            log.debug("netreduce: job '%s': %s did not take the fell-back report: %s", job,
                      format_address(tuple(address)), exc)
