"""Degraded mode where an operator looks (issue 14): a job that a real netreduce-switch
refused and that runs on the host all-reduce (NETREDUCE_FALLBACK=host) shows, while it
runs,

* in rank 0's metrics (NETREDUCE_JOB_METRICS): netreduce_job_degraded 1, degraded at
  start, the path it runs on;
* in the refusing daemon's metrics: netreduce_switch_jobs_fell_back_total{reason="memory",
  to="host"} (rank 0 told it; the refusal itself is jobs_refused_total);
* in `netreduce info` run with the job's environment: the path, DEGRADED and the
  refusal; without the job's secret the job's state is not readable.

An aggregator that cannot be reached at all cannot count the job: there the job's
own metrics are the place (second test)."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
import urllib.request
from typing import Callable, Dict, List

import pytest

from netreduce.process import free_tcp_port
from tests.parallel.test_failover import REPO, closed_port, launch, spawn_switch

pytestmark = pytest.mark.slow


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the series ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no series {name} {labels} in:\n{text}")


def info(env: Dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "netreduce.cli", "info"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def look_while_running(tmp_path, checks) -> "tuple[Callable[[], None], List[BaseException]]":
    """on_mark for launch(): run ``checks()`` while every rank waits, then
    let them go on. Errors are kept for the test's thread."""
    errors: List[BaseException] = []

    def on_mark() -> None:
        mark = glob.glob(str(tmp_path / "mark-*.0"))[0][:-2]
        try:
            checks()
        except BaseException as exc:  # re-raised by the test
            errors.append(exc)
        finally:
            open(mark + ".go", "w").close()
    return on_mark, errors


def test_a_refused_job_on_the_host_all_reduce_is_visible_everywhere(tmp_path):
    metrics = free_tcp_port()
    job_metrics = free_tcp_port()
    with spawn_switch(0, "--memory-mb", "1", "--metrics-port", str(metrics)) as sw:
        addr = f"{sw.address[0]}:{sw.address[1]}"
        extra = {"NETREDUCE_SWITCH": addr, "NETREDUCE_FALLBACK": "host",
                 "NETREDUCE_JOB_METRICS": f"127.0.0.1:{job_metrics}"}
        seen: Dict[str, str] = {}
        identity: Dict[str, str] = {}

        def checks() -> None:
            mine = scrape(job_metrics)
            seen["job"] = mine
            assert sample(mine, "netreduce_job_degraded") == 1
            assert sample(mine, "netreduce_job_degraded_at_start") == 1
            assert sample(mine, "netreduce_job_path_info", kind="host", primary="0") == 1
            assert sample(mine, "netreduce_job_failovers_total") == 0
            deadline = time.monotonic() + 10  # rank 0 reports in the background
            while True:
                daemon = scrape(metrics)
                try:
                    assert sample(daemon, "netreduce_switch_jobs_fell_back_total",
                                  reason="memory", to="host") == 1
                    break
                except AssertionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            assert sample(daemon, "netreduce_switch_jobs_refused_total", reason="memory") >= 1
            env = dict(os.environ, PYTHONPATH=REPO, **identity, **extra)
            text = info(env)
            seen["info"] = text
            assert "now: job '" in text and "DEGRADED" in text, text
            assert "host all-reduce" in text and "slot memory exhausted" in text, text
            env.pop("NETREDUCE_JOB_SECRET")
            text = info(env)
            assert "DEGRADED" not in text and "secret" in text, text

        on_mark, errors = look_while_running(tmp_path, checks)
        results = launch(tmp_path, 2, extra, mode="hold", steps=3, on_mark=on_mark,
                         job_env=identity)
    if errors:
        raise errors[0]
    for r in results:
        assert r.get("returncode") == 0 and "failure" not in r and "wrong" not in r, r
        assert r["checked"] == 6 and r["stats"]["path_kind"] == "host", r


def test_an_unreachable_aggregator_shows_in_the_jobs_own_metrics(tmp_path):
    job_metrics = free_tcp_port()
    port = closed_port()
    extra = {"NETREDUCE_SWITCH": f"127.0.0.1:{port}", "NETREDUCE_FALLBACK": "host",
             "NETREDUCE_JOB_METRICS": f"127.0.0.1:{job_metrics}"}
    seen: Dict[str, str] = {}

    def checks() -> None:
        seen["job"] = scrape(job_metrics)

    on_mark, errors = look_while_running(tmp_path, checks)
    results = launch(tmp_path, 2, extra, mode="hold", steps=2, on_mark=on_mark)
    if errors:
        raise errors[0]
    assert all(r.get("returncode") == 0 and r["checked"] == 4 for r in results), results
    assert sample(seen["job"], "netreduce_job_degraded") == 1
    assert sample(seen["job"], "netreduce_job_degraded_at_start") == 1
