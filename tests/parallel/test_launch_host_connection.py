"""One ssh connection and one keeper per remote host (launcher/host_connection.py,
remote.py), without a remote host: the `ssh` on PATH of test_launch_spawn.py, which
runs the remote command here. Two ranks of one host share the connection and the
keeper, yet each keeps its own output lines, signals and exit code."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from netreduce.launcher import spawn
from netreduce.testbed import proc_stat
from tests.parallel.test_launch_spawn import FAKE_SSH


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ssh").write_text(FAKE_SSH)
    (tmp_path / "bin" / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


RANK = r"""
import os, signal, sys, time
r = int(os.environ["R"])
def bye(signum, frame):
    print("got", signum, flush=True)
    sys.exit(10 + r)
signal.signal(signal.SIGTERM, bye)
print(os.environ["SECRET_OF_TEST"], r, flush=True)
print("err", r, file=sys.stderr, flush=True)
sys.stdout.write(f"unterminated {r}")
sys.stdout.flush()
with open(os.path.join(sys.argv[1], f"{r}.pid"), "w") as f:
    f.write(f"{os.getpid()} {os.getppid()}")
time.sleep(60)
"""


def _pids(d, r, deadline):
    path = os.path.join(d, f"{r}.pid")
    while not os.path.exists(path) or not open(path).read():
        assert time.monotonic() < deadline, f"rank {r} did not start"
        time.sleep(0.02)
    return [int(x) for x in open(path).read().split()]


def test_ranks_of_a_host_share_one_connection_and_keep_their_own_output_signals_codes(
        fake_ssh, capfd):
    tmp_path = fake_ssh
    out = spawn.Output(prefix=True, output_dir=str(tmp_path / "out"), size=4)
    conn = spawn.connect_host("nodeX", [2, 3], output=out)
    ranks = {r: spawn.start([sys.executable, "-c", RANK, str(tmp_path)], r, "nodeX",
                            dict(os.environ, SECRET_OF_TEST="s3cr3t", R=str(r)), local=False,
                            output=out, cwd=str(tmp_path), connected=conn.ranks[r])
             for r in (2, 3)}
    deadline = time.monotonic() + 30
    (_, keeper2), (pid3, keeper3) = _pids(tmp_path, 2, deadline), _pids(tmp_path, 3, deadline)
    # One ssh client and one keeper for both ranks; no secret on its command line.
    assert ranks[2].pid == ranks[3].pid == conn.proc.pid
    assert keeper2 == keeper3
    with open(f"/proc/{keeper2}/cmdline", "rb") as f:
        keeper_argv = f.read().split(b"\0")
    assert b"-S" in keeper_argv and spawn.LOADER.encode() in keeper_argv, keeper_argv
    for pid in (conn.proc.pid, keeper2):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"s3cr3t" not in f.read()
    # A signal reaches its rank only; stopping one rank leaves the other running.
    ranks[2].send_signal(signal.SIGTERM)
    assert ranks[2].wait(10) == 12
    assert ranks[3].poll() is None and proc_stat.alive(pid3)
    ranks[3].disconnect()  # the host's last rank: the connection closes, the keeper stops it
    assert ranks[3].wait(10) == 13
    assert conn.proc.wait(10) is not None and not proc_stat.alive(keeper2)
    out.close()
    printed = capfd.readouterr()
    for r in (2, 3):
        assert f"[{r}]<stdout>:s3cr3t {r}\n" in printed.out
        assert f"[{r}]<stdout>:unterminated {r}got {int(signal.SIGTERM)}\n" in printed.out
        assert f"[{r}]<stderr>:err {r}\n" in printed.err
        assert (tmp_path / "out" / f"rank.{r}" / "stdout").read_text() == \
            f"s3cr3t {r}\nunterminated {r}got {int(signal.SIGTERM)}\n"


def test_a_rank_that_cannot_start_leaves_its_host_neighbour_running(fake_ssh, capfd):
    out = spawn.Output(prefix=True, size=2)
    conn = spawn.connect_host("nodeX", [0, 1], output=out)
    bad = spawn.start(["/nonexistent/program"], 0, "nodeX", dict(os.environ), local=False,
                      output=out, connected=conn.ranks[0])
    good = spawn.start([sys.executable, "-c", "print('fine')"], 1, "nodeX", dict(os.environ),
                       local=False, output=out, connected=conn.ranks[1])
    assert bad.wait(30) == 127 and good.wait(30) == 0
    assert conn.proc.wait(10) == 127  # the keeper exits once every rank has
    out.close()
    printed = capfd.readouterr()
    assert "[0]<stderr>:netreduce-run: cannot start rank 0 on nodeX: /nonexistent/program" \
        in printed.err
    assert "[1]<stdout>:fine\n" in printed.out


def test_a_failed_connection_fails_every_rank_of_the_host_with_ssh_code(tmp_path, monkeypatch,
                                                                         capfd):
    (tmp_path / "ssh").write_text("#!/bin/sh\necho 'ssh: connect to host nodeX port 22: "
                                  "Connection refused' >&2\nexit 255\n")
    (tmp_path / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    out = spawn.Output(prefix=True, size=4)
    conn = spawn.connect_host("nodeX", [2, 3], output=out)
    ranks = [spawn.start(["true"], r, "nodeX", dict(os.environ), local=False, output=out,
                         connected=conn.ranks[r]) for r in (2, 3)]
    assert [r.wait(10) for r in ranks] == [255, 255]
    out.close()
    # ssh's message once, as the host's first rank's.
    assert capfd.readouterr().err == \
        "[2]<stderr>:ssh: connect to host nodeX port 22: Connection refused\n"
