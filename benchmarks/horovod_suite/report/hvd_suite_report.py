"""pytest plugin loaded into every rank by benchmarks/horovod_suite/run.py
(``-p hvd_suite_report``): appends one JSON line per test phase to
``$HVD_SUITE_REPORT/rank<r>.jsonl``, so the harness learns each rank's outcome even
when a rank dies half-way (the lines written so far survive).

It also gives the ranks of a netreduce-run job the rank variables horovodrun sets
(HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK, _CROSS_SIZE): Horovod's
test files read them to know they run under Gloo — which rank to expect, whether a
re-init test applies, whether tearDown shuts down — as in Horovod's own Gloo CI leg
(``horovodrun -np 2 -H localhost:2 --gloo``). Under horovodrun they are already set
and left alone.
"""
from __future__ import annotations

import json
import os
import time

_RANK_VARS = ("HOROVOD_RANK", "NETREDUCE_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK")


def _rank() -> str:
    for var in _RANK_VARS:
        if os.environ.get(var, "") != "":
            return os.environ[var]
    return "0"


def _horovodrun_variables() -> None:
    env = os.environ
    if "HOROVOD_RANK" in env or "NETREDUCE_RANK" not in env:
        return
    size = env.get("NETREDUCE_SIZE", "1")
    env["HOROVOD_RANK"] = env["NETREDUCE_RANK"]
    env["HOROVOD_SIZE"] = size
    env["HOROVOD_LOCAL_RANK"] = env.get("NETREDUCE_LOCAL_RANK", env["NETREDUCE_RANK"])
    env["HOROVOD_LOCAL_SIZE"] = env.get("NETREDUCE_LOCAL_SIZE", size)
    env["HOROVOD_CROSS_RANK"] = "0"   # netreduce-run: every rank on this one host
    env["HOROVOD_CROSS_SIZE"] = "1"


def _message(report) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    lines = (getattr(report, "longreprtext", "") or "").strip().splitlines()
    errors = [line[2:].strip() for line in lines if line.startswith("E ")]
    head = " | ".join(errors[-3:]) if errors else (lines[-1] if lines else "")
    return head[:600]


class _Recorder:
    def __init__(self, path: str) -> None:
        self.path = path

    def _write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def pytest_runtest_logreport(self, report) -> None:
        self._write({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                     "seconds": round(report.duration, 3), "message": _message(report),
                     "time": time.time()})

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self._write({"nodeid": report.nodeid, "when": "collect", "outcome": "failed",
                         "seconds": 0.0, "message": _message(report), "time": time.time()})


def pytest_configure(config) -> None:
    folder = os.environ.get("HVD_SUITE_REPORT")
    if not folder:
        return
    _horovodrun_variables()
    config.pluginmanager.register(_Recorder(os.path.join(folder, f"rank{_rank()}.jsonl")),
                                  "hvd_suite_recorder")
