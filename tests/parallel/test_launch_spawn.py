"""launcher/spawn.py's remote path without a remote host: an `ssh` on PATH that drops
ssh's options and runs the remote command here, so the loader, the keeper
(launcher/remote.py), the environment on stdin, signal forwarding and the stop on
a closed connection are all exercised as over real ssh (tests/root/test_launch_ssh.py
does that across network namespaces)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from netreduce.launcher import spawn
from netreduce.testbed import proc_stat

FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -o|-p|-i) shift 2;; -*) shift;; *) break;; esac; done
shift
exec sh -c "$*"
"""

RANK = r"""
import os, signal, sys, time
def bye(signum, frame):
    print("got", signum, flush=True)
    sys.exit(7)
signal.signal(signal.SIGTERM, bye)
print(os.environ["SECRET_OF_TEST"], os.getcwd(), os.environ.get("HOME"), flush=True)
print("to stderr", file=sys.stderr, flush=True)
open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
time.sleep(60)
"""


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def _start(tmp_path, capsys_out, rank=5):
    out = spawn.Output(prefix=True, output_dir=str(tmp_path / "out"), size=12)
    env = dict(os.environ, SECRET_OF_TEST="s3cr3t", HOME="/nonexistent-home")
    r = spawn.start([sys.executable, "-c", RANK, str(tmp_path)], rank, "nodeX", env, local=False,
                    output=out, cwd=str(tmp_path))
    deadline = time.monotonic() + 30
    while not [p for p in os.listdir(tmp_path) if p.isdigit()]:
        assert r.poll() is None and time.monotonic() < deadline, r.poll()
        time.sleep(0.02)
    pid = int(next(p for p in os.listdir(tmp_path) if p.isdigit()))
    return r, out, pid


def test_remote_rank_gets_its_environment_on_stdin_and_its_signals(fake_ssh, capfd):
    tmp_path = fake_ssh
    r, out, pid = _start(tmp_path, capfd)
    assert r.remote and " -S -c " in " ".join(r.argv) and "s3cr3t" not in " ".join(r.argv)
    with open(f"/proc/{r.pid}/cmdline", "rb") as f:  # the ssh client's: no secret
        assert b"s3cr3t" not in f.read()
    r.send_signal(signal.SIGTERM)
    assert r.wait(10) == 7
    out.close()
    printed = capfd.readouterr()
    # HOME is the login's own, not forwarded; the rest of the environment is. Lines
    # are prefixed with the rank, files named with it zero-padded (as horovodrun does).
    home = os.environ["HOME"]
    assert f"[5]<stdout>:s3cr3t {tmp_path} {home}\n" in printed.out
    assert f"[5]<stdout>:got {int(signal.SIGTERM)}\n" in printed.out
    assert "[5]<stderr>:to stderr\n" in printed.err
    assert (tmp_path / "out" / "rank.05" / "stdout").read_text() == \
        f"s3cr3t {tmp_path} {home}\ngot {int(signal.SIGTERM)}\n"


def test_closed_connection_stops_the_remote_rank(fake_ssh, capfd):
    tmp_path = fake_ssh
    r, out, pid = _start(tmp_path, capfd)
    r.disconnect()
    assert r.wait(10) == 7  # the keeper's SIGTERM, which the rank turns into 7
    assert not proc_stat.alive(pid)
    out.close()


def test_missing_program_on_the_remote_host(fake_ssh, capfd):
    out = spawn.Output(prefix=True, size=1)
    r = spawn.start(["/nonexistent/program"], 0, "nodeX", dict(os.environ), local=False, output=out)
    assert r.wait(30) == 127
    out.close()
    assert "cannot start rank 0 on nodeX: /nonexistent/program" in capfd.readouterr().err


def test_local_rank_handle(tmp_path, capfd):
    out = spawn.Output(prefix=False, size=1)
    r = spawn.start([sys.executable, "-c", "import time; time.sleep(60)"], 0, "localhost",
                    dict(os.environ), local=True, output=out)
    assert not r.remote and r.poll() is None
    r.kill()
    assert r.returncode == -signal.SIGKILL
    with pytest.raises(spawn.LaunchError) as info:
        spawn.start(["/nonexistent/program"], 1, "localhost", dict(os.environ), local=True,
                    output=out)
    assert info.value.code == 127
