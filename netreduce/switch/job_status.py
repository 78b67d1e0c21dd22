"""A job with failover tells an operator what it runs on now, from rank 0's
in-process aggregator (switch/in_process.py), which serves the job's rendezvous
(docs/failover.md):

* ``job_status``: the path the job runs on now, whether it is degraded (the host
  all-reduce: no aggregator sums its gradients), why it did not start on its first
  path, and its failovers — the failover algorithm's ``status()``. The asker proves
  the job's secret as a rank does: knowing the job's name and address is not enough
  to read it (``netreduce info`` asks: netreduce/worker/job_status.py);
* with NETREDUCE_JOB_METRICS=HOST:PORT, Prometheus metrics of the same state
  (``netreduce_job_*``, labelled with the job's name; docs/operations.md).
"""
from __future__ import annotations

import logging
from typing import Any, Iterator

from netreduce.errors import NetReduceError
from netreduce.protocol.address import format_address, parse_address
from netreduce.protocol.messages import JobStatus, JobStatusReply
from netreduce.switch.commands import RequestError, register_handler

log = logging.getLogger("netreduce")
PREFIX = "netreduce_job"


def _handle_status(srv: Any, sess: Any, msg: JobStatus) -> JobStatusReply:
    job = msg.job
    srv.admit(sess, job, msg.rank, msg.auth)  # the job's secret, if it has one
    algorithm = getattr(srv, "_nr_job_status", {}).get(job)
    if algorithm is None:
        raise RequestError(f"no job '{job}' runs with this rendezvous")
    return JobStatusReply(status=algorithm.status())


class Published:
    """Rank 0's job state on its rendezvous server, and its metrics endpoint."""

    def __init__(self, server: Any, algorithm: Any, metrics_at: str) -> None:
        register_handler(JobStatus, _handle_status, inline=True)
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
        # prometheus_client loads only for a job that asked for metrics
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
