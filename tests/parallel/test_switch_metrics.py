"""netreduce-switch --metrics-port: a real daemon, a real job through it, /metrics
scraped over HTTP and read with prometheus_client's own parser; the values must be
the job's (packets = chunks x ranks, bytes reduced = bytes x ranks, ...)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

from netreduce.worker import dataplane
from netreduce.errors import NetReduceError
from netreduce.process import terminate
from netreduce.switch import METRICS_PREFIX, READY_PREFIX

parser = pytest.importorskip("prometheus_client.parser")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PAYLOAD = 4096   # --payload-bytes: standard RoCE-sized chunks, so several per tensor
COUNT = 10_007   # float32 elements: 40,028 bytes = 10 chunks, the last one short
SIZE = 2


def _start(*flags: str) -> Tuple[subprocess.Popen, Tuple[str, int], str]:
    cmd = [sys.executable, "-m", "netreduce.switch", "--host", "127.0.0.1", "--port", "0",
           "--metrics-port", "0", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    url, address = None, None
    deadline = time.monotonic() + 30
    assert proc.stdout is not None
    while address is None and time.monotonic() < deadline and proc.poll() is None:
        # No select(): when both lines came in one read, readline() holds the ready
        # line in its buffer, where select() no longer sees it (a 30 s wait for
        # nothing). A daemon that exits ends the read (""), pytest-timeout a hung one.
        line = proc.stdout.readline()
        if line.startswith(METRICS_PREFIX):
            url = line[len(METRICS_PREFIX):].strip()
        elif line.startswith(READY_PREFIX):
            host, _, port = line[len(READY_PREFIX):].split()[0].rpartition(":")
            address = (host, int(port))
    if address is None or url is None:
        terminate(proc)
        pytest.fail(f"netreduce-switch did not start (exit {proc.returncode}): {cmd}")
    return proc, address, url


def _scrape(url: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def _get(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def daemon():
    # unicast: the per-job packet counts below are one result per rank
    proc, address, url = _start("--payload-bytes", str(PAYLOAD), "--max-jobs", "1",
                                "--fanout", "unicast")
    yield address, url
    terminate(proc)
    assert proc.returncode == 0  # SIGTERM is a clean stop
    proc.stdout.close()


def _one_job(address, job: str) -> List[dataplane.Connection]:
    conns = [dataplane.connect(address, job, r, SIZE, timeout=20.0) for r in range(SIZE)]
    arrays = [np.full(COUNT, r + 1, np.float32) for r in range(SIZE)]
    reqs = [c.allreduce_async(a) for c, a in zip(conns, arrays)]
    for req in reqs:
        req.wait()
    for a in arrays:
        assert (a == SIZE * (SIZE + 1) / 2).all()
    return conns


def test_scrape_counts_the_job(daemon):
    address, url = daemon
    before = _scrape(url)
    assert _get(before, "netreduce_switch_jobs_admitted_total") == 0
    assert _get(before, "netreduce_switch_jobs_max") == 1
    assert not [k for k in before if k[0].startswith("netreduce_switch_job_")]

    job = "metrics-" + uuid.uuid4().hex[:8]
    conns = _one_job(address, job)
    try:
        # A second job while the first holds the only --max-jobs place: refused, counted.
        with pytest.raises(NetReduceError, match="max-jobs"):
            dataplane.connect(address, "refused-" + job, 0, 1, timeout=5.0).allreduce(
                np.zeros(4, np.float32))
        m = _scrape(url)
        assert _get(m, "netreduce_switch_job_payload_bytes", job=job) == PAYLOAD
        if conns[0].counters()["jobs"][job].get("payload_reason"):  # the control plane says why
            assert [k for k in m
                    if k[0] == "netreduce_switch_job_payload_info" and ("job", job) in k[1]]
    finally:
        for c in conns:
            c.close()

    payload = _get(m, "netreduce_switch_job_payload_bytes", job=job)
    assert payload == PAYLOAD
    chunks = math.ceil(COUNT * 4 / payload)
    assert chunks == 10
    dup = _get(m, "netreduce_switch_job_duplicates_total", job=job)
    resent = _get(m, "netreduce_switch_job_retransmitted_results_total", job=job)
    held = _get(m, "netreduce_switch_job_held_notices_total", job=job)
    # Every chunk from every rank once, plus any retransmission (counted as duplicate).
    assert _get(m, "netreduce_switch_job_packets_total", job=job, direction="in") == \
        chunks * SIZE + dup
    # ... and out, plus the held notices: the first message's chunks asked (the ranks
    # had no round-trip estimate yet), at most one per chunk and send of it
    assert held <= chunks * SIZE + dup
    assert _get(m, "netreduce_switch_job_packets_total", job=job, direction="out") == \
        chunks * SIZE + resent + held
    assert _get(m, "netreduce_switch_job_reduced_bytes_total", job=job) == COUNT * 4 * SIZE
    assert _get(m, "netreduce_switch_job_slots_completed_total", job=job) == chunks
    assert _get(m, "netreduce_switch_job_rounds_started_total", job=job) == chunks
    assert _get(m, "netreduce_switch_job_slots_filling", job=job) == 0
    assert _get(m, "netreduce_switch_job_world_size", job=job) == SIZE
    assert _get(m, "netreduce_switch_job_ranks_registered", job=job) == SIZE
    assert _get(m, "netreduce_switch_job_slot_memory_bytes", job=job) == \
        _get(m, "netreduce_switch_job_slots", job=job) * payload * 2
    assert _get(m, "netreduce_switch_job_drops_total", job=job, reason="bad_icrc") == 0
    # from no registered address (a replay: tests/parallel/test_data_address.py)
    assert _get(m, "netreduce_switch_job_drops_total", job=job, reason="bad_source") == 0
    assert ("netreduce_switch_job_drops_total", (("job", job), ("reason", "unknown_job"))) \
        not in m  # decided before a datagram names a job: global only

    # Global: the same job, plus the refused one.
    assert _get(m, "netreduce_switch_jobs_admitted_total") == 1
    assert _get(m, "netreduce_switch_jobs_refused_total", reason="max_jobs") == 1
    assert _get(m, "netreduce_switch_jobs_refused_total", reason="memory") == 0
    assert _get(m, "netreduce_switch_jobs_active") == 1
    assert _get(m, "netreduce_switch_reduced_bytes_total") == COUNT * 4 * SIZE
    assert _get(m, "netreduce_switch_packets_total", direction="in") >= chunks * SIZE
    assert _get(m, "netreduce_switch_slot_memory_bytes") == \
        _get(m, "netreduce_switch_job_slot_memory_bytes", job=job)
    assert _get(m, "netreduce_switch_drops_total", reason="unknown_job") == 0
    assert _get(m, "netreduce_switch_info", address=f"{address[0]}:{address[1]}",
                fanout="unicast", threads="1", version=_get_version()) == 1
    assert _get(m, "process_resident_memory_bytes") > 0

    # docs/operations.md lists every metric the daemon exports.
    doc = open(os.path.join(ROOT, "docs", "operations.md")).read()
    undocumented = sorted({name for name, _ in m if name.startswith("netreduce_switch")
                           and f"`{name}`" not in doc})
    assert not undocumented, f"not in docs/operations.md: {undocumented}"

    assert _get(m, "netreduce_switch_job_finished", job=job) == 0

    # The job's pool leaves with its last rank; its series stay, their last values,
    # marked finished (--finished-job-s, 120 s by default); the lifetime counters too.
    after = _after_the_job(url)
    assert _get(after, "netreduce_switch_slot_memory_bytes") == 0
    assert _get(after, "netreduce_switch_reduced_bytes_total") == COUNT * 4 * SIZE
    assert _get(after, "netreduce_switch_job_finished", job=job) == 1
    assert _get(after, "netreduce_switch_job_ranks_registered", job=job) == 0
    for name, labels in [("netreduce_switch_job_reduced_bytes_total", {}),
                         ("netreduce_switch_job_slots_completed_total", {}),
                         ("netreduce_switch_job_packets_total", {"direction": "in"})]:
        assert _get(after, name, job=job, **labels) == _get(m, name, job=job, **labels)


def _after_the_job(url: str) -> Dict[Any, float]:
    """A scrape once the daemon has no job admitted (its last rank's leave is handled
    on the daemon's loop, after the rank's close returned)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = _scrape(url)
        if _get(after, "netreduce_switch_jobs_active") == 0:
            break
        time.sleep(0.1)
    assert _get(after, "netreduce_switch_jobs_active") == 0
    return after


def test_a_finished_jobs_series_go_after_finished_job_s():
    proc, address, url = _start("--finished-job-s", "1", "--fanout", "unicast")
    try:
        job = "gone-" + uuid.uuid4().hex[:8]
        for c in _one_job(address, job):
            c.close()
        _after_the_job(url)
        deadline = time.monotonic() + 30  # kept 1 s; a loaded machine scrapes late
        while time.monotonic() < deadline:
            after = _scrape(url)
            if not [k for k in after if k[0].startswith("netreduce_switch_job_")]:
                break
            time.sleep(0.2)
        assert not [k for k in after if k[0].startswith("netreduce_switch_job_")]
        assert _get(after, "netreduce_switch_reduced_bytes_total") == COUNT * 4 * SIZE
    finally:
        terminate(proc)
        proc.stdout.close()


def _get_version() -> str:
    import netreduce
    return netreduce.__version__


def test_metrics_port_in_use_is_a_clear_error():
    proc, _, url = _start()
    try:
        port = url.rsplit(":", 1)[1].split("/")[0]
        out = subprocess.run([sys.executable, "-m", "netreduce.switch", "--host", "127.0.0.1",
                              "--port", "0", "--metrics-port", port],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 2
        assert f"cannot serve metrics on 127.0.0.1:{port}" in out.stderr
    finally:
        terminate(proc)
        proc.stdout.close()
