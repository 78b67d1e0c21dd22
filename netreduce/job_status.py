"""Where an operator sees what a job with failover runs on now (docs/failover.md).

An aggregator that cannot be reached cannot count a job that went on without it,
so the job says it itself. Rank 0 of a job started with failover serves the job's
rendezvous (job_paths.start); there it also answers

* ``job_status``: the path the job runs on now, whether it is degraded (the host
  all-reduce: no aggregator sums its gradients), why it did not start on its first
  path, and its failovers. ``netreduce info`` asks it at NETREDUCE_RENDEZVOUS (or
  MASTER_ADDR:MASTER_PORT+1), proving NETREDUCE_JOB_SECRET when the job has one,
  as a rank does: knowing the job's name and address is not enough to read it;
* with NETREDUCE_JOB_METRICS=HOST:PORT, Prometheus metrics of the same state
  (``netreduce_job_*``, labelled with the job's name; docs/operations.md).

An aggregator that refused the job but is reachable counts that itself
(``netreduce_switch_jobs_refused_total``); rank 0 also tells it that the job went on
elsewhere (``fell_back``), which it counts as ``netreduce_switch_jobs_fell_back_total``.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Iterator

from netreduce.protocol.address import format_address, parse_address
from netreduce.errors import NetReduceError

log = logging.getLogger("netreduce")
PREFIX = "netreduce_job"


def _handle_status(srv: Any, sess: Any, msg: Dict[str, Any]) -> Dict[str, Any]:
    from netreduce.switch.commands import RequestError
    job = str(msg.get("job", ""))
    srv.admit(sess, job, int(msg.get("rank", -1)), msg)  # the job's secret, if it has one
    algorithm = getattr(srv, "_nr_job_status", {}).get(job)
    if algorithm is None:
        raise RequestError(f"no job '{job}' runs with this rendezvous")
    return {"status": algorithm.status()}


class Published:
    """Rank 0's job state on its rendezvous server, and its metrics endpoint."""

    def __init__(self, server: Any, algorithm: Any, metrics_at: str) -> None:
        from netreduce.switch.commands import register_handler
        register_handler("job_status", _handle_status, inline=True)
        self.server, self.job = server, algorithm.job
        table = getattr(server, "_nr_job_status", None)
        if table is None:
            table = server._nr_job_status = {}
        table[self.job] = algorithm
        self._httpd = self._thread = None
        self.metrics_address = None
        if metrics_at:
            self._serve_metrics(algorithm, metrics_at)

    def _serve_metrics(self, algorithm: Any, text: str) -> None:
        from prometheus_client import start_http_server
        from prometheus_client.registry import CollectorRegistry
        host, port = parse_address(text, what="NETREDUCE_JOB_METRICS")
        registry = CollectorRegistry()
        registry.register(JobCollector(algorithm))
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise NetReduceError(f"rank 0 of job '{algorithm.job}': cannot serve metrics on "
                                 f"NETREDUCE_JOB_METRICS={text}: {exc}") from None
        self.metrics_address = (host, int(self._httpd.server_port))
        log.info("netreduce: job '%s' metrics on http://%s/metrics", algorithm.job,
                 format_address(self.metrics_address))

    def close(self) -> None:
        getattr(self.server, "_nr_job_status", {}).pop(self.job, None)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5.0)
            self._httpd = None


class JobCollector:
    """Reads the failover algorithm's status() at each scrape."""

    def __init__(self, algorithm: Any) -> None:
        self.algorithm = algorithm

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            InfoMetricFamily)
        s = self.algorithm.status()
        job = [s["job"]]
        m = GaugeMetricFamily(f"{PREFIX}_degraded", "1 while the job runs on the host "
                              "all-reduce among its ranks (no aggregator), else 0", labels=["job"])
        m.add_metric(job, int(s["degraded"]))
        yield m
        m = GaugeMetricFamily(f"{PREFIX}_degraded_at_start", "1 if the job's first path (the "
                              "NETREDUCE_SWITCH aggregators) did not admit it at start",
                              labels=["job"])
        m.add_metric(job, int(bool(s["start_reasons"])))
        yield m
        m = InfoMetricFamily(f"{PREFIX}_path", "The data path the job runs on now",
                             labels=["job"])
        m.add_metric(job, {"path": s["path"], "kind": s["path_kind"],
                           "primary": str(int(s["on_primary"]))})
        yield m
        m = CounterMetricFamily(f"{PREFIX}_failovers", "Failovers since the job started "
                                "(a path died mid-job and the job moved on)", labels=["job"])
        m.add_metric(job, s["failovers"])
        yield m
        m = GaugeMetricFamily(f"{PREFIX}_generation", "Path generation (+1 per failover)",
                              labels=["job"])
        m.add_metric(job, s["generation"])
        yield m


def query(knobs: Dict[str, Any], job: str, secret: str, timeout: float = 2.0) -> Dict[str, Any]:
    """For `netreduce info`: the job's status from its rendezvous, or why not."""
    from netreduce.protocol import auth
    from netreduce.protocol.client import ControlClient
    from netreduce.job_paths import rendezvous_address
    try:
        address = rendezvous_address(knobs)
    except (NetReduceError, ValueError) as exc:
        return {"error": str(exc)}
    out: Dict[str, Any] = {"rendezvous": format_address(address)}
    try:
        with ControlClient(address, timeout=timeout) as client:
            proof = auth.prove(client.call, secret, job, -1)
            out.update(client.call("job_status", job=job, rank=-1, **proof)["status"])
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
    from netreduce.protocol.client import ControlClient
    if cand.kind != "switch":
        return
    reason = refusal_reason(reason_text)
    for address in cand.addresses:
        try:
            with ControlClient(tuple(address), timeout=1.0) as client:
                client.call("fell_back", reason=reason, to=to, timeout=1.0)
        except NetReduceError as exc:  # unreachable, or an older daemon
            log.debug("netreduce: job '%s': %s did not take the fell-back report: %s", job,
                      format_address(tuple(address)), exc)
