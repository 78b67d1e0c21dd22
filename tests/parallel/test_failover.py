"""Failover and degraded mode (issue 14), real daemons and rank processes on loopback.

* admission: an unreachable or refusing aggregator with NETREDUCE_FALLBACK=host runs
  the job on the host all-reduce (every rank, exact); with =error every rank gets an
  error naming the aggregator and the refusal;
* mid-job: the aggregator SIGKILLed inside a multi-chunk all-reduce, the job goes on
  on a standby, on the same daemon restarted, or on the host all-reduce; every
  result bit-identical to numpy and identical across ranks, and at least one rank
  did hold partial in-place results when the path died;
* no path left: every rank fails with an error naming the dead aggregator;
* a Horovod-API torch training loop keeps going across the kill.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Callable, Dict, List, Optional

import pytest

from netreduce.errors import NetReduceError
from netreduce.process import free_tcp_port
from tests.procs import collect

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "failover_worker.py")
pytestmark = pytest.mark.slow


def spawn_switch(port: int = 0, *extra: str):
    from netreduce.switch import spawn
    return spawn(host="127.0.0.1", port=port, extra_args=list(extra))


def closed_port() -> int:
    return free_tcp_port()  # nothing listens there once the probe socket closed


def launch(tmp_path, n: int, env_extra: Dict[str, str], mode: str = "exact", steps: int = 12,
           on_mark: Optional[Callable[[], None]] = None, timeout: float = 240,
           kill_delay: float = 0.0, job_env: Optional[Dict[str, str]] = None,
           prefix: Optional[Callable[[int], List[str]]] = None) -> List[dict]:
    mark = str(tmp_path / f"mark-{uuid.uuid4().hex[:6]}")
    job = "fo-" + uuid.uuid4().hex[:8]
    rv = f"127.0.0.1:{free_tcp_port()}"
    if job_env is not None:  # the job's identity, for a test that looks at it while it runs
        job_env.update(NETREDUCE_JOB=job, NETREDUCE_RENDEZVOUS=rv,
                       NETREDUCE_JOB_SECRET="s3cret-" + job)
    procs = []
    for r in range(n):
        # flat unless a test asks for more: all ranks on one host would run the
        # hierarchical algorithm, whose data never reaches the aggregator
        env = dict(os.environ, NETREDUCE_JOB=job, NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(n),
                   NETREDUCE_RENDEZVOUS=rv, NETREDUCE_TIMEOUT="10",
                   NETREDUCE_JOB_SECRET="s3cret-" + job, PYTHONFAULTHANDLER="1",
                   PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
                   NETREDUCE_ALGORITHM="flat")
        env.update(env_extra)  # may replace any of the above (a testbed's rendezvous)
        cmd = (prefix(r) if prefix else []) + [sys.executable, WORKER, mode, mark, str(steps)]
        procs.append(subprocess.Popen(cmd, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    killer = None
    if on_mark is not None:
        def watch() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and \
                    not all(os.path.exists(f"{mark}.{r}") for r in range(n)):
                time.sleep(0.002)
            time.sleep(kill_delay)
            on_mark()
        killer = threading.Thread(target=watch, daemon=True)
        killer.start()
    results = collect(procs, timeout, stacks=True)  # PYTHONFAULTHANDLER above
    if killer is not None:
        killer.join(5)
    return results


def assert_exact(results: List[dict], steps: int) -> None:
    for r in results:
        assert r.get("returncode") == 0 and "failure" not in r and "wrong" not in r, r
        assert r["checked"] == steps, r
    assert len({r["digest"] for r in results}) == 1, "ranks disagree"


def kill(proc, mid_transfer: bool = False) -> Callable[[], None]:
    """SIGKILL ``proc``; ``mid_transfer``: only once it has completed (and so sent the
    results of) 16 slots more than when every rank reached the 16 MiB all-reduce, i.e.
    inside that all-reduce's data with results already back at the ranks (negotiation
    before it takes a varying time on a loaded host; summed bytes alone can be the two
    fast ranks' windows with no slot complete, and then no rank holds a partial result)."""
    def do() -> None:
        if mid_transfer:
            from netreduce.protocol.client import ControlClient
            try:
                with ControlClient(proc.address, timeout=10) as c:
                    base = c.call("counters")["global"]["slots_completed"]
                    deadline = time.monotonic() + 30
                    while c.call("counters")["global"]["slots_completed"] < base + 16 \
                            and time.monotonic() < deadline:
                        time.sleep(0.001)
            except NetReduceError:
                pass  # the daemon closed this reader: kill it now
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait()
    return do


# --- degraded mode at admission ---------------------------------------------------
def test_unreachable_aggregator_falls_back_to_host(tmp_path):
    port = closed_port()
    results = launch(tmp_path, 3, {"NETREDUCE_SWITCH": f"127.0.0.1:{port}",
                                   "NETREDUCE_FALLBACK": "host"}, steps=6)
    assert_exact(results, 6)
    for r in results:
        assert r["stats"]["path_kind"] == "host" and r["stats"]["degraded_at_start"], r["stats"]
        assert r["stats"]["failovers"] == 0
    # logged once, by rank 0, naming the aggregator and why
    assert f"127.0.0.1:{port}" in results[0]["stderr"] and "NETREDUCE_FALLBACK=host" in \
        results[0]["stderr"], results[0]["stderr"]
    assert "NETREDUCE_FALLBACK" not in results[1]["stderr"]


@pytest.mark.parametrize("fallback", ["host", "error"])
def test_refusing_aggregator(tmp_path, fallback):
    # 1 MiB of slot memory cannot hold one job's pool (32 slots x 64 KiB x 2)
    with spawn_switch(0, "--memory-mb", "1") as sw:
        addr = f"{sw.address[0]}:{sw.address[1]}"
        results = launch(tmp_path, 2, {"NETREDUCE_SWITCH": addr, "NETREDUCE_FALLBACK": fallback},
                         steps=4)
    if fallback == "host":
        assert_exact(results, 4)
        assert all(r["stats"]["path_kind"] == "host" for r in results)
    else:
        for r in results:
            assert "failure" in r and "AdmissionError" in r["failure"], r
            assert addr in r["failure"] and "refused" in r["failure"], r["failure"]


# --- failover mid-job -------------------------------------------------------------
def check_failover(results: List[dict], steps: int, to: str) -> None:
    assert_exact(results, steps)
    for r in results:
        assert r["stats"]["failovers"] == 1, r["stats"]
        assert to in r["stats"]["path"], r["stats"]
    # The kill landed inside a multi-chunk all-reduce: some rank held part of its
    # results in place when the path died, and still every result is exact.
    assert any(r["stats"]["interrupted_partial"] for r in results), \
        [r["history"] for r in results]


def test_sigkill_moves_the_job_to_the_standby(tmp_path):
    with spawn_switch() as primary, spawn_switch() as standby:
        a = f"{primary.address[0]}:{primary.address[1]}"
        b = f"{standby.address[0]}:{standby.address[1]}"
        results = launch(tmp_path, 3, {"NETREDUCE_SWITCH": a, "NETREDUCE_STANDBY_SWITCH": b},
                         steps=12, on_mark=kill(primary, mid_transfer=True))
    check_failover(results, 12, b)
    assert a in results[0]["history"][0]["from"]


def test_sigkill_then_restart_takes_the_same_daemon_back(tmp_path):
    port = free_tcp_port()
    box = {"sw": spawn_switch(port)}
    addr = f"127.0.0.1:{port}"

    def kill_and_restart() -> None:
        kill(box["sw"], mid_transfer=True)()
        # Not spawn(): its PR_SET_PDEATHSIG would take the daemon down with this
        # (short-lived) thread, the "parent" the kernel means.
        proc = subprocess.Popen([sys.executable, "-m", "netreduce.switch", "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and "listening" in proc.stdout.readline()
        from netreduce.switch import SwitchProcess
        box["sw"] = SwitchProcess(proc, ("127.0.0.1", port))

    try:
        # A window of 2 slots: the 16 MiB all-reduce lasts ~128 round trips, so the kill
        # (16 slots in) lands inside it even when this thread is descheduled for a few
        # ms — with the full window and GSO a loaded host could see it end first.
        results = launch(tmp_path, 2, {"NETREDUCE_SWITCH": addr, "NETREDUCE_STANDBY_SWITCH": addr,
                                       "NETREDUCE_WINDOW": "2"},
                         steps=12, on_mark=kill_and_restart)
    finally:
        box["sw"].stop()
    check_failover(results, 12, addr)


def test_sigkill_without_standby_goes_to_host(tmp_path):
    with spawn_switch() as primary:
        a = f"{primary.address[0]}:{primary.address[1]}"
        results = launch(tmp_path, 3, {"NETREDUCE_SWITCH": a, "NETREDUCE_FALLBACK": "host"},
                         steps=12, on_mark=kill(primary, mid_transfer=True))
    check_failover(results, 12, "host all-reduce")


def test_no_path_left_names_the_aggregator(tmp_path):
    dead = f"127.0.0.1:{closed_port()}"
    with spawn_switch() as primary:
        a = f"{primary.address[0]}:{primary.address[1]}"
        # The failover tries each path for NETREDUCE_TIMEOUT (a restarting daemon may come
        # back) before it gives up: 3 s here, not launch()'s 10, so 2 x 3 s
        results = launch(tmp_path, 2, {"NETREDUCE_SWITCH": a, "NETREDUCE_STANDBY_SWITCH": dead,
                                       "NETREDUCE_TIMEOUT": "3"},
                         steps=12, on_mark=kill(primary), timeout=120)
    for r in results:
        # Its own data plane's error, or (when the other rank's came first) that rank's
        # error passed on by the coordinator: either way both addresses are named.
        assert "failure" in r and r["failure"].split(":")[0] in (
            "DataPlaneError", "RankFailedError"), r
        assert a in r["failure"] and dead in r["failure"], r["failure"]


def test_torch_training_continues_across_a_kill(tmp_path):
    pytest.importorskip("torch")
    with spawn_switch() as primary, spawn_switch() as standby:
        a = f"{primary.address[0]}:{primary.address[1]}"
        b = f"{standby.address[0]}:{standby.address[1]}"
        results = launch(tmp_path, 2, {"NETREDUCE_SWITCH": a, "NETREDUCE_STANDBY_SWITCH": b},
                         mode="torch", steps=10, on_mark=kill(primary))
    assert_exact(results, 10)
    for r in results:
        assert r["stats"]["failovers"] == 1 and b in r["stats"]["path"], r["stats"]
        assert r["losses"][-1] < r["losses"][0], r["losses"]
