"""netreduce-run across hosts over ssh, as horovodrun runs jobs: a 2-host testbed
with Debian's sshd in each host namespace (throwaway host and user keys), and
`netreduce-run -np 4 -H h0:2,h1:2 -p 22 -i KEY ...` started from the root namespace,
outside them. The ranks must run in their hosts' namespaces with horovodrun's
variables, all-reduce exactly through the aggregator netreduce-run started on the
bridge's address, and the job secret must show on no command line of any host. Each
host is one ssh connection and one keeper that forks the host's ranks (as mpirun's
orted does), not one per rank. A failing remote rank stops the job, its neighbour on
the same keeper included; a SIGKILLed netreduce-run leaves nothing behind on the
hosts. Skipped, with the reason, when not root or sshd is missing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from netreduce.launcher import spawn
from netreduce.testbed import Testbed, why_unusable
from netreduce.testbed import sshd
from netreduce.testbed import proc_stat
from tests.root import scratch_subnet, scratch_testbed_name

REASON = why_unusable() or sshd.why_unusable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "launch-ssh-test-" + "5e" * 24

# A rank: init, say where it runs, wait for the test's "go" (it looks at every host's
# process list meanwhile), then all-reduce and record the results.
RANK = r"""
import json, os, sys, time
import numpy as np
import netreduce as nr
d = sys.argv[1]
nr.init()
r, n = nr.rank(), nr.size()
names = ("HOROVOD_RANK HOROVOD_SIZE HOROVOD_LOCAL_RANK HOROVOD_LOCAL_SIZE HOROVOD_CROSS_RANK "
         "HOROVOD_CROSS_SIZE HOROVOD_HOSTNAME RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE "
         "NETREDUCE_SWITCH").split()
facts = {k: os.environ.get(k) for k in names}
facts.update(rank=r, size=n, local_rank=nr.local_rank(), local_size=nr.local_size(),
             netns=os.stat("/proc/self/ns/net").st_ino, cwd=os.getcwd(), pid=os.getpid(),
             ppid=os.getppid())
open(os.path.join(d, f"ready.{r}"), "w").close()
while not os.path.exists(os.path.join(d, "go")):
    time.sleep(0.02)
ints = nr.allreduce(np.arange(100_000, dtype=np.int32) * (r + 1), op=nr.Sum)
floats = nr.allreduce(np.full(70_001, 0.5 * (r + 1), np.float32), op=nr.Sum)
facts["ints_ok"] = bool((ints == np.arange(100_000) * (n * (n + 1) // 2)).all())
facts["floats_ok"] = bool((floats == 0.25 * n * (n + 1)).all())
with open(os.path.join(d, f"facts.{r}.json"), "w") as f:
    json.dump(facts, f)
print("done", r, flush=True)
nr.shutdown()
"""

# A rank that starts a child, records both pids, and sleeps; FAIL_RANK exits 3 once
# every rank has written its pids.
SLEEPER = r"""
import os, subprocess, sys, time
d, r, n = sys.argv[1], int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
child = subprocess.Popen(["sleep", "120"])
with open(os.path.join(d, f"{r}.pid"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
if r == int(os.environ.get("FAIL_RANK", "-1")):
    while len([x for x in os.listdir(d) if x.endswith(".pid")]) < n:
        time.sleep(0.05)
    sys.exit(3)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def hosts():
    with Testbed(hosts=2, rate="1gbit", name=scratch_testbed_name("s"), subnet=scratch_subnet(),
                 replace=True) as tb, sshd.SshHosts(tb) as ssh:
        yield tb, ssh


def _launcher(ssh, args, env_extra=None):
    env = ssh.client_env(dict(os.environ, PYTHONPATH=REPO, NETREDUCE_JOB_SECRET=SECRET,
                              **(env_extra or {})))
    env.pop("NETREDUCE_SWITCH", None)
    return ssh.client_argv([sys.executable, "-m", "netreduce.launcher", *args]), env


def _wait_files(d, names, timeout_s, proc):
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(os.path.join(d, n)) for n in names):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"not all of {names} within {timeout_s} s"
        time.sleep(0.05)


def _keepers() -> dict:
    """{network namespace inode: [pid of each ssh-started keeper running in it]}: the
    processes whose command line is the loader (`python -S -c LOADER`)."""
    found: dict = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            netns = os.stat(f"/proc/{name}/ns/net").st_ino
        except OSError:
            continue
        if spawn.LOADER.encode() in argv and b"-S" in argv:
            found.setdefault(netns, []).append(int(name))
    return found


def _gone_within(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(proc_stat.alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if proc_stat.alive(p)]


@pytest.mark.timeout(120)
def test_ranks_across_ssh_hosts_reduce_exactly_and_hide_the_secret(hosts, tmp_path):
    tb, ssh = hosts
    out = tmp_path / "out"
    argv, env = _launcher(ssh, ["-np", "4", "-H", "h0:2,h1:2", "-p", "22", "-i", ssh.identity,
                                "--start-timeout", "30", "--output-filename", str(out),
                                sys.executable, "-c", RANK, str(tmp_path)])
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_files(tmp_path, [f"ready.{r}" for r in range(4)], 90, proc)
        # Every rank is up (and its ssh client and keeper with it): no command line
        # on any host holds the secret.
        for where in [None] + list(range(len(tb.hosts))) + ["agg"]:
            ps = ["ps", "-eww", "-o", "pid=,args="]
            listing = subprocess.run(ps if where is None else tb.exec_argv(where, ps),
                                     capture_output=True, text=True, check=True).stdout
            assert "netreduce.launcher" in listing and " -S -c " in listing  # the job is there
            assert SECRET not in listing, [ln for ln in listing.splitlines() if SECRET in ln]
        keepers = _keepers()
        (tmp_path / "go").touch()
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout + stderr
    assert sorted(stdout.split("\n"))[1:] == [f"[{r}]<stdout>:done {r}" for r in range(4)]
    netns = {i: int(tb.run(i, ["stat", "-L", "-c", "%i", "/proc/self/ns/net"], capture_output=True,
                           text=True, check=True).stdout) for i in range(2)}
    bridge = tb.plan.bridge_address
    for r in range(4):
        facts = json.loads((tmp_path / f"facts.{r}.json").read_text())
        host, local = divmod(r, 2)
        assert facts["ints_ok"] and facts["floats_ok"], facts
        assert facts["netns"] == netns[host], (r, facts["netns"], netns)  # ran on its host
        assert (facts["rank"], facts["size"], facts["local_rank"], facts["local_size"]) == (r, 4, local, 2)
        assert facts["HOROVOD_HOSTNAME"] == f"h{host}"
        assert [facts[k] for k in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                                   "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
                                   "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")] == \
            [str(v) for v in (r, 4, local, 2, host, 2, r, 4, local, 2)]
        assert facts["NETREDUCE_SWITCH"].startswith(bridge + ":")  # dialled back by route
        assert facts["cwd"] == REPO
        assert (out / f"rank.{r}" / "stdout").read_text() == f"done {r}\n"
    # One connection and one keeper per host, which forked both of the host's ranks.
    for host in range(2):
        assert len(keepers.get(netns[host], [])) == 1, (host, keepers, netns)
        parents = {json.loads((tmp_path / f"facts.{r}.json").read_text())["ppid"]
                   for r in (2 * host, 2 * host + 1)}
        assert parents == set(keepers[netns[host]]), (host, parents, keepers)


@pytest.mark.timeout(90)
def test_a_failing_remote_rank_stops_the_job_and_leaves_nothing(hosts, tmp_path):
    tb, ssh = hosts
    argv, env = _launcher(ssh, ["-np", "4", "-H", "h0:2,h1:2", "-i", ssh.identity,
                                "--switch", f"{tb.aggregator.address}:9", sys.executable, "-c",
                                SLEEPER, str(tmp_path)], {"FAIL_RANK": "3"})
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "rank 3 on h1 exited with code 3" in proc.stderr, proc.stderr
    pids = [int(p) for r in range(4) for p in (tmp_path / f"{r}.pid").read_text().split()]
    assert _gone_within(pids, 5.0) == []  # ranks and what they started, on both hosts
    print(f"failing remote rank: job over in {elapsed:.1f} s")


@pytest.mark.timeout(90)
def test_sigkilled_launcher_leaves_nothing_on_the_hosts(hosts, tmp_path):
    tb, ssh = hosts
    argv, env = _launcher(ssh, ["-np", "3", "-H", "h0:1,h1:2", "-i", ssh.identity,
                                "--switch", f"{tb.aggregator.address}:9", sys.executable, "-c",
                                SLEEPER, str(tmp_path)])
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_files(tmp_path, [f"{r}.pid" for r in range(3)], 60, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    pids = [int(p) for r in range(3) for p in (tmp_path / f"{r}.pid").read_text().split()]
    # ssh clients die with the launcher; each keeper sees its stdin end and stops its
    # rank's process group: SIGTERM, SIGKILL 3 s later.
    assert _gone_within(pids, 10.0) == []
