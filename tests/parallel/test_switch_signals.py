"""netreduce-switch as a service (netreduce/switch/service.py): SIGHUP logs the
status and changes nothing; SIGTERM closes admission, tells the connected jobs, waits
at most --stop-timeout for their ranks to leave and exits 0. Real daemon, real rank
processes."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import List, Sequence, Tuple

import numpy as np
import pytest

from netreduce.worker import dataplane
from netreduce.process import terminate
from netreduce.switch import READY_PREFIX

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Daemon:
    def __init__(self, *flags: str, prefix: Sequence[str] = ()) -> None:
        # prefix: a command the daemon runs under (setpriv, to drop a capability)
        cmd = [*prefix, sys.executable, "-m", "netreduce.switch", "--host", "127.0.0.1",
               "--port", "0", *flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.log: List[str] = []
        threading.Thread(target=self._read_stderr, daemon=True).start()
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(READY_PREFIX):
                host, _, port = line[len(READY_PREFIX):].split()[0].rpartition(":")
                self.address: Tuple[str, int] = (host, int(port))
                break
        else:
            raise AssertionError(f"netreduce-switch did not start: {self.log}")

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))

    def wait_log(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.log):
                if text in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not logged within {timeout} s; log: {self.log}")

    def close(self) -> None:
        terminate(self.proc)
        for f in (self.proc.stdout, self.proc.stderr):
            if f:
                f.close()


def _job(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def test_sighup_logs_status_and_changes_nothing():
    d = Daemon()
    try:
        job = _job("hup")
        conns = [dataplane.connect(d.address, job, r, 2, timeout=20.0) for r in range(2)]
        arrays = [np.full(5000, r + 1, np.float32) for r in range(2)]
        for req in [c.allreduce_async(a) for c, a in zip(conns, arrays)]:
            req.wait()
        d.proc.send_signal(signal.SIGHUP)
        line = d.wait_log(f"job '{job}'")
        assert "2/2 ranks" in line and "40000 B reduced" in line, line
        summary = d.wait_log(f"status {d.address[0]}:{d.address[1]}")
        assert "1 admitted" in summary, summary
        assert d.proc.poll() is None  # SIGHUP does not stop the daemon
        # ... nor the job: it carries on with the same pool.
        arrays = [np.full(5000, r + 1, np.float32) for r in range(2)]
        for req in [c.allreduce_async(a) for c, a in zip(conns, arrays)]:
            req.wait()
        assert all((a == 3).all() for a in arrays)
        for c in conns:
            c.close()
    finally:
        d.close()
    assert d.proc.returncode == 0


RANK = r"""
import os, sys, time
import numpy as np
import netreduce as nr
from netreduce.errors import NetReduceError
nr.init()
nr.allreduce(np.ones(10, np.float32), name="warmup")
open(os.environ["READY"] + str(nr.rank()), "w").close()
try:
    for step in range(100000):
        nr.allreduce(np.ones(1000, np.float32), name="step")
        time.sleep(0.02)
except NetReduceError as exc:
    print("FAILED:", exc, flush=True)
    sys.exit(3)
"""


def test_sigterm_stops_admission_tells_jobs_and_exits_zero(tmp_path):
    d = Daemon("--stop-timeout", "60")
    held = None
    ranks = []
    try:
        # A data-plane-only rank (no negotiation, so it is not told): it keeps the
        # daemon draining until it leaves.
        held = dataplane.connect(d.address, _job("held"), 0, 1, timeout=20.0)
        held.allreduce(np.ones(4, np.float32))
        job = _job("busy")
        env = dict(os.environ, NETREDUCE_SWITCH=f"{d.address[0]}:{d.address[1]}",
                   NETREDUCE_SIZE="2", NETREDUCE_JOB=job, NETREDUCE_TIMEOUT="20",
                   NETREDUCE_ALGORITHM="flat",  # one aggregator job per netreduce job
                   READY=str(tmp_path / "ready."), PYTHONPATH=ROOT)
        ranks = [subprocess.Popen([sys.executable, "-c", RANK], env=dict(env, NETREDUCE_RANK=str(r)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(2)]
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready.{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline, "ranks did not start"
            assert all(p.poll() is None for p in ranks), [p.communicate() for p in ranks]
            time.sleep(0.05)

        d.proc.send_signal(signal.SIGTERM)
        d.wait_log("SIGTERM: stopping: admission closed; 2 jobs (3 ranks) connected, 1 told")
        # The busy job's ranks fail with an error naming the aggregator and the reason.
        for p in ranks:
            out, _ = p.communicate(timeout=30)
            assert p.returncode == 3, out
            assert f"netreduce-switch {d.address[0]}:{d.address[1]} is shutting down (SIGTERM)" \
                in out, out
        # Still draining (the held rank is connected), but admitting nothing.
        assert d.proc.poll() is None
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(d.address, timeout=5).close()
        assert d.proc.poll() is None
        held.close()  # the last rank leaves: the drain ends at once, well before 60 s
        assert d.proc.wait(timeout=30) == 0
        assert not [line for line in d.log if "still connected" in line], d.log
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.communicate()
        if held is not None:
            held.close()
        d.close()


def test_sigterm_without_jobs_is_quiet_and_immediate():
    d = Daemon()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=20) == 0
    d.close()
    assert not [line for line in d.log if "WARNING" in line], d.log


def test_sigterm_exits_zero_at_the_bound_when_ranks_stay():
    d = Daemon("--stop-timeout", "1")
    held = dataplane.connect(d.address, _job("stays"), 0, 1, timeout=20.0)
    try:
        held.allreduce(np.ones(4, np.float32))
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=30) == 0
        d.wait_log("stopping with 1 ranks of 1 jobs still connected")
    finally:
        held.close()
        d.close()
