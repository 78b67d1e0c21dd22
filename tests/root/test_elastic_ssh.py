"""Elastic netreduce-run across hosts over ssh (docs/elastic.md): a 2-host testbed with
sshd in each host namespace (netreduce/testbed/sshd.py), the aggregator in the
aggregator namespace, ``netreduce-run -np 4 --min-np 2 -H h0:2,h1:2`` from the root
namespace. The workers dial the driver back on the bridge's address; both ranks of
h1 SIGKILLed (in h1's namespace): h1 is blacklisted and h0's two ranks finish alone,
with identical parameters. Skipped, with the reason, when not root or sshd is missing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from netreduce.testbed import Testbed, why_unusable
from netreduce.testbed import sshd
from tests.parallel.test_elastic_run import worker_records
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable() or sshd.why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "parallel", "elastic_worker.py")


@pytest.mark.timeout(180)
def test_a_hosts_ranks_killed_over_ssh(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with Testbed(hosts=2, rate="1gbit", name=scratch_testbed_name("e"), subnet=scratch_subnet(),
                 replace=True) as tb, sshd.SshHosts(tb) as ssh:
        switch = tb.spawn_switch(args=["--require-secret"])
        env = ssh.client_env(dict(os.environ, PYTHONPATH=REPO, ELASTIC_OUT=str(out),
                                  ELASTIC_STEPS="60", NETREDUCE_TIMEOUT="20"))
        env.pop("NETREDUCE_SWITCH", None)
        argv = ssh.client_argv([sys.executable, "-m", "netreduce.launcher", "-np", "4",
                                "--min-np", "2", "-H", "h0:2,h1:2", "-i", ssh.identity,
                                "--switch", f"{switch.address[0]}:{switch.address[1]}",
                                sys.executable, WORKER])
        log = open(tmp_path / "run.log", "w+")
        proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

        def output():
            log.flush()
            log.seek(0)
            return log.read()
        try:
            deadline = time.monotonic() + 120
            while max((r.get("step", 0) for rs in worker_records(out).values() for r in rs),
                      default=0) < 10:
                assert proc.poll() is None and time.monotonic() < deadline, output()
                time.sleep(0.1)
            victims = [int(p) for p in subprocess.run(["ip", "netns", "pids", tb.hosts[1].netns],
                                                      capture_output=True, text=True).stdout.split()]
            workers = [p for p in victims if "elastic_worker.py" in open(f"/proc/{p}/cmdline").read()]
            assert len(workers) == 2, (victims, output())
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            assert proc.wait(120) == 0, output()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            switch.stop()
    finals = {w: rs[-1]["final"] for w, rs in worker_records(out).items() if rs and "final" in rs[-1]}
    assert sorted(finals) == ["h0_0", "h0_1"], output()
    assert len({f["w"] for f in finals.values()}) == 1
    sizes = finals["h0_0"]["sizes"]
    assert len(sizes) == 60 and sizes[0] == 4 and sizes[-1] == 2, sizes
    assert "host h1 blacklisted" in output()
