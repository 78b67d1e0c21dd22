"""Elastic netreduce-run end to end (docs/elastic.md): real processes, a real
aggregator, the driver's discovery script a file the test rewrites. Two host names
of this machine (localhost, 127.0.0.1, as in Horovod's own elastic tests) are two
hosts. Every scenario ends in bounded time with a clear outcome: the survivors finish
with identical parameters, or netreduce-run fails naming why."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

import pytest

from tests.procs import ROOT

WORKER = os.path.join(ROOT, "tests", "parallel", "elastic_worker.py")



def worker_records(out: str) -> Dict[str, List[dict]]:
    """Each worker's step log in OUT (its <host>_<slot>.jsonl lines), by worker."""
    rows = {}
    for path in glob.glob(os.path.join(out, "*.jsonl")):
        with open(path) as f:
            rows[os.path.basename(path)[:-6]] = [json.loads(line) for line in f if line.strip()]
    return rows


class Run:
    """netreduce-run with elastic flags, hosts from a file the test rewrites."""

    def __init__(self, tmp_path, hosts: List[str], flags: List[str],
                 command: Optional[List[str]] = None, **env: str) -> None:
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.hosts_file = tmp_path / "hosts.txt"
        self.set_hosts(hosts)
        script = tmp_path / "discover.sh"
        script.write_text(f"#!/bin/sh\ncat {self.hosts_file}\n")
        script.chmod(0o755)
        full = dict(os.environ, ELASTIC_OUT=str(self.out), **env)
        full["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        self.log = open(tmp_path / "netreduce-run.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "netreduce.launcher", "--host-discovery-script", str(script),
             *flags, *(command or [sys.executable, WORKER])], cwd=ROOT, env=full, stdout=self.log,
            stderr=subprocess.STDOUT)

    def set_hosts(self, hosts: List[str]) -> None:
        tmp = str(self.hosts_file) + ".new"
        with open(tmp, "w") as f:
            f.write("".join(h + "\n" for h in hosts))
        os.replace(tmp, self.hosts_file)  # the driver never reads half a file

    def records(self) -> Dict[str, List[dict]]:
        return worker_records(str(self.out))

    def steps(self) -> Dict[str, int]:
        return {w: max([r.get("step", 0) for r in recs] or [0]) for w, recs in self.records().items()}

    def wait_for(self, what, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert self.proc.poll() is None, f"netreduce-run ended early:\n{self.output()}"
            assert time.monotonic() < deadline, f"timed out waiting:\n{self.output()}"
            time.sleep(0.1)

    def kill_worker(self, worker: str) -> None:
        os.kill(self.records()[worker][0]["pid"], signal.SIGKILL)

    def finish(self, timeout: float = 120.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(10)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def finals(self) -> Dict[str, dict]:
        return {w: recs[-1]["final"] for w, recs in self.records().items()
                if recs and "final" in recs[-1]}


def _same_parameters(finals: Dict[str, dict]) -> None:
    ws = {f["w"] for f in finals.values()}
    assert len(ws) == 1, f"survivors differ: {len(ws)} different parameter vectors"


def test_hosts_added_and_removed_by_discovery(tmp_path):
    run = Run(tmp_path, ["localhost:2"], ["-np", "2", "--min-np", "2", "--max-np", "4"],
              ELASTIC_STEPS="30", ELASTIC_HOLD="5,20")
    run.wait_for(lambda: max(run.steps().values() or [0]) >= 5)
    run.set_hosts(["localhost:2", "127.0.0.1:2"])  # grow to 4
    run.wait_for(lambda: run.steps().get("127.0.0.1_1", 0) >= 20)
    run.set_hosts(["localhost:2"])  # shrink to 2: 127.0.0.1's workers leave
    assert run.finish() == 0, run.output()
    finals = run.finals()
    assert sorted(finals) == ["localhost_0", "localhost_1"], run.output()
    _same_parameters(finals)
    sizes = finals["localhost_0"]["sizes"]
    # every step ran once (the state rolled forward, never twice), each change at the
    # commit after the step at which it was made
    assert sizes == [2] * 6 + [4] * 15 + [2] * 9, f"sizes per step: {sizes}"
    assert finals["localhost_0"]["resets"] == [[0, 4], [0, 2]]
    out = run.output()
    assert "epoch 2: 4 rank(s) on localhost:2, 127.0.0.1:2 (was 2)" in out
    assert "epoch 3: 2 rank(s) on localhost:2 (was 4)" in out
    assert "host 127.0.0.1 is no longer discovered" in out


def test_a_killed_rank_blacklists_its_host_and_the_survivors_finish(tmp_path):
    run = Run(tmp_path, ["localhost:2", "127.0.0.1:2"], ["-np", "4", "--min-np", "2"],
              ELASTIC_STEPS="40")
    run.wait_for(lambda: run.steps().get("127.0.0.1_1", 0) >= 10)
    run.kill_worker("127.0.0.1_1")
    assert run.finish() == 0, run.output()
    finals = run.finals()
    assert sorted(finals) == ["localhost_0", "localhost_1"], run.output()
    _same_parameters(finals)
    sizes = finals["localhost_0"]["sizes"]
    assert len(sizes) == 40 and sizes[0] == 4 and sizes[-1] == 2, sizes
    out = run.output()
    assert "worker 127.0.0.1:1 (rank 3 of 4, epoch 1) was killed by SIGKILL" in out
    assert "host 127.0.0.1 blacklisted" in out
    # the killed rank's host neighbour left the job cleanly, with code 0
    assert "127.0.0.1:0 (rank 2 of epoch 1) is not in the job's next membership: host " \
           "127.0.0.1 is blacklisted" in out


def test_all_hosts_failing_fails_the_job(tmp_path):
    run = Run(tmp_path, ["localhost:1", "127.0.0.1:1"], ["-np", "2", "--min-np", "1"],
              ELASTIC_FAIL="all")
    code = run.finish(60)
    assert code == 1, run.output()
    assert "every worker of epoch 1: 2 rank(s) on localhost:1, 127.0.0.1:1 failed" in run.output()


def test_below_min_np_for_the_elastic_timeout_fails_the_job(tmp_path):
    run = Run(tmp_path, ["localhost:1", "127.0.0.1:1"],
              ["-np", "2", "--min-np", "2", "--elastic-timeout", "2"], ELASTIC_STEPS="400")
    run.wait_for(lambda: max(run.steps().values() or [0]) >= 3)
    run.set_hosts(["localhost:1"])
    t0 = time.monotonic()
    assert run.finish(60) == 1, run.output()
    assert time.monotonic() - t0 < 30
    out = run.output()
    assert "waiting for 2 slots; the hosts not blacklisted offer 1" in out, out
    assert "--elastic-timeout 2" in out


def test_the_reset_limit_fails_the_job(tmp_path):
    run = Run(tmp_path, ["localhost:1"], ["-np", "1", "--min-np", "1", "--reset-limit", "1"],
              ELASTIC_STEPS="400")
    run.wait_for(lambda: max(run.steps().values() or [0]) >= 3)
    run.set_hosts(["localhost:1", "127.0.0.1:1"])  # reset 1: allowed
    run.wait_for(lambda: run.steps().get("127.0.0.1_0", 0) >= 3)
    run.set_hosts(["localhost:1"])  # reset 2: over the limit
    assert run.finish(60) == 1, run.output()
    assert "its number of resets reached --reset-limit 1" in run.output()


def test_an_aggregator_restart_during_a_resize(tmp_path):
    """A host's rank SIGKILLed and the aggregator SIGKILLed with it: the survivors
    reset, find no aggregator for their new epoch, and start in that epoch as soon as
    a new daemon listens on the same address."""
    from netreduce.switch import spawn
    daemon = spawn(host="127.0.0.1", port=0)
    port = daemon.address[1]
    run = Run(tmp_path, ["localhost:2", "127.0.0.1:2"],
              ["-np", "4", "--min-np", "2", "--switch", f"127.0.0.1:{port}"],
              ELASTIC_STEPS="40")
    try:
        run.wait_for(lambda: run.steps().get("127.0.0.1_1", 0) >= 8)
        run.kill_worker("127.0.0.1_1")
        daemon.proc.kill()
        daemon.proc.wait()
        time.sleep(1.5)  # the survivors' new epoch finds nobody at the port meanwhile
        daemon = spawn(host="127.0.0.1", port=port)
        assert run.finish() == 0, run.output()
    finally:
        daemon.stop()
    finals = run.finals()
    assert sorted(finals) == ["localhost_0", "localhost_1"], run.output()
    _same_parameters(finals)
    sizes = finals["localhost_0"]["sizes"]
    assert len(sizes) == 40 and sizes[0] == 4 and sizes[-1] == 2, sizes
