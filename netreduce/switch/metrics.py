"""Prometheus metrics of netreduce-switch (``--metrics-port``).

A custom collector: every scrape reads the native aggregator's counters (relaxed
atomics the data threads keep anyway) and the control server's job table at that
moment, so nothing copies numbers in the background and a scrape never sees a job
that has already left. Names follow Prometheus conventions: counters end in
``_total``, sizes in ``_bytes``; ``netreduce_switch_*`` counts over the daemon's
lifetime, ``netreduce_switch_job_*{job="..."}`` over one admitted job (the series
stay ``--finished-job-s`` after the job's last rank leaves, with ``finished`` 1:
switch/finished.py). docs/operations.md lists every metric."""
from __future__ import annotations

import logging
from typing import Any, Dict, Iterator, List, Optional, Tuple

from prometheus_client import start_http_server
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily,
                                    Metric)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from netreduce.switch import service

log = logging.getLogger("netreduce.switch")

PREFIX = "netreduce_switch"

# Native counter keys -> (metric suffix, help). Per job and global alike.
_COUNTERS: List[Tuple[str, str, str]] = [
    ("bytes_reduced", "reduced_bytes", "Payload bytes summed into slots (each rank's contribution once)"),
    ("rounds_started", "rounds_started", "Slot rounds begun (a chunk's first contribution reached a slot)"),
    ("slots_completed", "slots_completed", "Slot rounds completed: every rank contributed, result sent"),
    ("duplicates", "duplicates", "Contributions seen before (retransmissions), never added again"),
    ("retransmitted_results", "retransmitted_results",
     "Results re-sent to a rank that retransmitted into a completed slot"),
    ("held_notices", "held_notices",
     "Held notices: a rank without a round-trip estimate asked, and its round waits for others"),
    ("group_unicast_copies", "group_unicast_copies",
     "--fanout auto: results also sent by unicast to a rank the multicast group had not "
     "reached within a second"),
]
_DIRECTIONAL = [("packets", "packets", "RoCEv2 datagrams, in = from workers, out = results"),
                ("bytes", "bytes", "UDP payload bytes of those datagrams (headers included)")]


# Drops decided before a datagram is tied to a job: counted globally only.
_GLOBAL_ONLY_DROPS = {"truncated", "bad_opcode", "unknown_job"}


def _drop_reasons(counters: Dict[str, int], per_job: bool = False) -> List[str]:
    reasons = sorted(k[len("drop_"):] for k in counters if k.startswith("drop_"))
    return [r for r in reasons if not (per_job and r in _GLOBAL_ONLY_DROPS)]


def _refusal_reasons(counters: Dict[str, int]) -> List[str]:
    return sorted(k[len("jobs_refused_"):] for k in counters if k.startswith("jobs_refused_"))


class SwitchCollector(Collector):
    """Reads ``server.counters()`` (ControlServer: native global and per-job
    counters plus the job table) at each scrape."""

    def __init__(self, server: Any, info: Optional[Dict[str, str]] = None) -> None:
        self.server = server
        self.info = dict(info or {})

    def collect(self) -> Iterator[Metric]:
        snap = self.server.counters()
        glob: Dict[str, int] = snap["global"]
        jobs: Dict[str, Dict[str, Any]] = snap["jobs"]
        yield from self._global(glob, jobs)
        yield from self._jobs(jobs)

    def _global(self, g: Dict[str, int], jobs: Dict[str, Dict[str, Any]]) -> Iterator[Metric]:
        if self.info:
            yield InfoMetricFamily(PREFIX, "How this netreduce-switch was started", value=self.info)
        for key, name, doc in _DIRECTIONAL:
            m = CounterMetricFamily(f"{PREFIX}_{name}", doc + " (all jobs)", labels=["direction"])
            m.add_metric(["in"], g[f"{key}_in"])
            m.add_metric(["out"], g[f"{key}_out"])
            yield m
        for key, name, doc in _COUNTERS:
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc + " (all jobs)", value=g[key])
        m = CounterMetricFamily(f"{PREFIX}_drops", "Datagrams dropped, by reason (all jobs and "
                                "datagrams that name no job)", labels=["reason"])
        for reason in _drop_reasons(g):
            m.add_metric([reason], g["drop_" + reason])
        yield m
        yield CounterMetricFamily(f"{PREFIX}_jobs_admitted", "Jobs admitted (slot pools allocated)",
                                  value=g["jobs_admitted"])
        yield CounterMetricFamily(f"{PREFIX}_jobs_resized", "Elastic jobs moved to a new "
                                  "membership epoch in place (switch/epochs.py)",
                                  value=g.get("job_resizes", 0))
        m = CounterMetricFamily(f"{PREFIX}_jobs_refused", "Jobs refused admission, by reason",
                                labels=["reason"])
        for reason in _refusal_reasons(g):
            m.add_metric([reason], g["jobs_refused_" + reason])
        yield m
        m = CounterMetricFamily(f"{PREFIX}_jobs_fell_back", "Jobs refused here (or that could "
                                "not reach this daemon) that went on elsewhere, as their rank 0 "
                                "reported: to = host (the host all-reduce) or switch (another "
                                "aggregator)", labels=["reason", "to"])
        for (reason, to), n in sorted(service.fell_back_counts(self.server).items()):
            m.add_metric([reason, to], n)
        yield m
        for key, name, doc in [
                ("jobs_active", "jobs_active", "Jobs admitted now"),
                ("jobs_max", "jobs_max", "Jobs that may be admitted at once (--max-jobs)"),
                ("slot_memory_bytes", "slot_memory_bytes", "Slot memory held by admitted jobs"),
                ("slot_memory_limit_bytes", "slot_memory_limit_bytes",
                 "Slot memory limit over all jobs (--memory-mb)")]:
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=g[key])
        filling = sum(_filling(c) for c in jobs.values())
        yield GaugeMetricFamily(f"{PREFIX}_slots_filling",
                                "Slot rounds begun but not complete, over admitted jobs "
                                "(slot occupancy)", value=filling)

    def _jobs(self, jobs: Dict[str, Dict[str, Any]]) -> Iterator[Metric]:
        fam: Dict[str, Metric] = {}

        def family(kind: type, name: str, doc: str, labels: List[str]) -> Metric:
            if name not in fam:
                fam[name] = kind(f"{PREFIX}_job_{name}", doc, labels=["job"] + labels)
            return fam[name]

        for job, c in sorted(jobs.items()):
            for key, name, doc in _DIRECTIONAL:
                m = family(CounterMetricFamily, name, doc, ["direction"])
                m.add_metric([job, "in"], c[f"{key}_in"])
                m.add_metric([job, "out"], c[f"{key}_out"])
            for key, name, doc in _COUNTERS:
                family(CounterMetricFamily, name, doc, []).add_metric([job], c[key])
            m = family(CounterMetricFamily, "drops", "The job's datagrams dropped, by reason",
                       ["reason"])
            for reason in _drop_reasons(c, per_job=True):
                m.add_metric([job, reason], c["drop_" + reason])
            if c.get("payload_reason"):
                family(InfoMetricFamily, "payload", "Why the job's payload is what it is "
                       "(which path MTU decided it)", []).add_metric(
                           [job], {"reason": str(c["payload_reason"])})
            for name, doc, value in [
                    ("world_size", "Ranks in the job", c["size"]),
                    ("ranks_registered", "Ranks registered with the control port now",
                     len(c["ranks"])),
                    ("slots", "Slots in the job's pool (K)", c.get("slots", 0)),
                    ("payload_bytes", "Payload bytes per slot chosen for the job (P)",
                     c.get("payload_bytes", 0)),
                    ("slot_memory_bytes", "Slot memory of the job's pool (K x P x 2)",
                     c.get("slot_memory_bytes", 0)),
                    ("slots_filling", "Slot rounds begun but not complete (slot occupancy)",
                     _filling(c)),
                    ("membership_epoch", "An elastic job's membership epoch (0: not elastic)",
                     c.get("epoch", 0)),
                    ("finished", "1: the job's last rank has left and these are its last "
                     "counters, kept --finished-job-s", int(bool(c.get("finished"))))]:
                family(GaugeMetricFamily, name, doc, []).add_metric([job], value)
        yield from fam.values()


def _filling(c: Dict[str, Any]) -> int:
    # slots_completed is read before rounds_started, so the difference is >= 0.
    return max(0, int(c.get("rounds_started", 0)) - int(c.get("slots_completed", 0)))


class MetricsServer:
    """The /metrics HTTP endpoint (prometheus_client's threaded WSGI server)."""

    def __init__(self, server: Any, host: str, port: int,
                 info: Optional[Dict[str, str]] = None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(SwitchCollector(server, info))
        ProcessCollector(registry=self.registry)  # the daemon's CPU, memory, open fds
        self._httpd, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.host, self.port = host, int(self._httpd.server_port)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)
