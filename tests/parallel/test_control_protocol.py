"""The control protocol's edges against real daemons on loopback (issues 34 and 35):
a rank and an aggregator of different protocol versions are refused naming both
versions, either way round; a rank pointed at something that is not a netreduce
aggregator, or at a TLS one without NETREDUCE_TLS_CA, is told so; the rank that is
right in a job whose ranks disagree on the world size hears it at once; and
registrations that never complete neither fill --max-jobs nor outlive their
timeout."""
from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from netreduce.errors import AdmissionError, ControlPlaneError
from netreduce.protocol import messages
from netreduce.protocol.address import parse_address
from netreduce.protocol.client import ControlConnection
from netreduce.switch import spawn
from netreduce.switch.child import READY_PREFIX
from netreduce.worker import dataplane
from tests.parallel.tls_certs import make_ca, server_cert
from tests.procs import ROOT
from tests.raw_wire import read_line

OTHER = messages.PROTOCOL_VERSION + 1


def _job() -> str:
    return "proto-" + uuid.uuid4().hex[:8]


@pytest.fixture
def daemon():
    d = spawn(host="127.0.0.1", port=0)
    yield d
    d.stop()


@pytest.fixture
def other_version_daemon():
    """A real netreduce-switch that speaks control protocol PROTOCOL_VERSION + 1."""
    code = ("import sys; from netreduce.protocol import messages; "
            f"messages.PROTOCOL_VERSION = {OTHER}; "
            "from netreduce.switch.daemon import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=ROOT)
    line = proc.stdout.readline()
    assert line.startswith(READY_PREFIX), line
    yield ("127.0.0.1", parse_address(line[len(READY_PREFIX):].split()[0])[1])
    proc.terminate()
    proc.wait(15)


# --- the version exchange -------------------------------------------------------------
def test_a_rank_against_an_aggregator_of_another_protocol_version(other_version_daemon):
    with pytest.raises(AdmissionError) as info:
        dataplane.connect(other_version_daemon, _job(), 0, 1, timeout=10.0)
    text = str(info.value)
    assert f"control protocol {OTHER}" in text and \
        f"control protocol {messages.PROTOCOL_VERSION}" in text, text


def test_a_rank_of_another_protocol_version_against_this_aggregator(daemon, monkeypatch):
    monkeypatch.setattr(messages, "PROTOCOL_VERSION", OTHER)  # this rank speaks the other one
    with pytest.raises(AdmissionError) as info:
        dataplane.connect(daemon.address, _job(), 0, 1, timeout=10.0)
    text = str(info.value)
    assert f"speaks control protocol {OTHER}" in text and \
        f"speaks control protocol {OTHER - 1}" in text, text


def test_a_client_of_protocol_1_is_refused_naming_both_versions(daemon):
    # Protocol 1 had no version exchange: its first line was the request itself.
    with socket.create_connection(daemon.address, timeout=10) as s:
        s.sendall(b'{"cmd":"register","job":"old","rank":0,"size":1}\n')
        reply = read_line(s)
        assert reply["ok"] is False
        assert f"control protocol {messages.PROTOCOL_VERSION}" in reply["error"] and \
            "protocol 1" in reply["error"], reply
        assert s.recv(100) == b""  # and the connection closes


# --- errors that say what answered ------------------------------------------------------
class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def test_a_service_that_is_not_an_aggregator_is_named():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    try:
        with pytest.raises(AdmissionError) as info:
            dataplane.connect(("127.0.0.1", port), _job(), 0, 1, timeout=10.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
    # Python's http.server answers a line it cannot parse in HTTP/0.9 (a page, no
    # status line); another server says "HTTP/1.1 400 ...": either is quoted.
    text = str(info.value)
    assert re.match(rf"127\.0\.0\.1:{port} answered, but not as a netreduce aggregator "
                    r"\(it sent '(HTTP/1\.|<!DOCTYPE HTML>)", text), text


def test_a_plaintext_rank_against_a_tls_aggregator_is_told_to_set_the_ca(tmp_path, monkeypatch):
    ca_key, ca_cert, _ = make_ca(tmp_path, "ca")
    cert, key = server_cert(tmp_path, ca_key, ca_cert)
    monkeypatch.delenv("NETREDUCE_TLS_CA", raising=False)
    with spawn(host="127.0.0.1", port=0, tls_cert=str(cert), tls_key=str(key)) as d:
        with pytest.raises(AdmissionError) as info:
            dataplane.connect(d.address, _job(), 0, 1, timeout=10.0)
    text = str(info.value)
    assert f"the aggregator at 127.0.0.1:{d.address[1]} speaks TLS: set NETREDUCE_TLS_CA" in text, \
        text


def test_a_tls_rank_against_a_plaintext_aggregator_is_refused_at_once(daemon, tmp_path,
                                                                     monkeypatch):
    _, _, ca = make_ca(tmp_path, "ca")
    monkeypatch.setenv("NETREDUCE_TLS_CA", str(ca))  # TLS to the aggregators it was given
    monkeypatch.setenv("NETREDUCE_SWITCH", f"127.0.0.1:{daemon.address[1]}")
    with pytest.raises(ControlPlaneError) as info:
        dataplane.connect(daemon.address, _job(), 0, 1, timeout=60.0)
    text = str(info.value)
    # closed at its ClientHello, not left waiting for a line end until a timeout
    assert "TLS handshake failed" in text and "timed out" not in text, text


RANK = r"""
import json, sys
import netreduce as nr
from netreduce.errors import NetReduceError
try:
    nr.init()
    print(json.dumps({"ok": True}), flush=True)
except NetReduceError as exc:
    print(json.dumps({"error": str(exc)}), flush=True)
"""


def test_the_right_rank_hears_at_once_that_another_says_a_different_world_size(daemon):
    job = _job()
    address = f"127.0.0.1:{daemon.address[1]}"

    def rank(r: int, size: int) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=ROOT, NETREDUCE_SWITCH=address, NETREDUCE_JOB=job,
                   NETREDUCE_RANK=str(r), NETREDUCE_SIZE=str(size), NETREDUCE_LOCAL_RANK="0",
                   NETREDUCE_LOCAL_SIZE="1", NETREDUCE_START_TIMEOUT="600")
        return subprocess.Popen([sys.executable, "-c", RANK], env=env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    right = rank(0, 2)
    with ControlConnection(daemon.address) as c:  # rank 0 has registered the job first
        deadline = time.monotonic() + 60
        while job not in c.request(messages.Counters()).jobs:
            assert time.monotonic() < deadline and right.poll() is None, right.stderr.read()
            time.sleep(0.05)
    wrong = rank(1, 3)
    # Bounded well below the start timeout: "did not join" would come only after it.
    out = [p.communicate(timeout=90)[0] for p in (right, wrong)]
    want = f"job '{job}': rank 1 says world size 3 but the job was registered with 2"
    assert want in out[0] and want in out[1], out


# --- registrations that never complete (issue 35, item 2) --------------------------------
STRANGER = ("127.0.0.2", 0)  # another source address than the real ranks' 127.0.0.1


def _register_raw(address, job: str, rank: int, size: int) -> "tuple[socket.socket, dict]":
    """A stranger's raw connection: hello, then one register, and then it stays."""
    s = socket.create_connection(address, timeout=10, source_address=STRANGER)
    s.sendall((f'{{"cmd":"hello","version":{messages.PROTOCOL_VERSION}}}\n').encode())
    assert read_line(s)["ok"]
    s.sendall((f'{{"cmd":"register","job":"{job}","rank":{rank},"size":{size},'
               f'"data_address":"{STRANGER[0]}:9"}}\n').encode())
    return s, read_line(s)


def _told(s: socket.socket) -> dict:
    """Wait (asking for the payload) until the aggregator refuses the job; then the
    connection closes (after --handshake-timeout)."""
    s.settimeout(30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s.sendall(b'{"cmd":"payload","wait":5}\n')
        reply = read_line(s)
        if not reply["ok"]:
            assert s.recv(100) == b""
            return reply
    raise AssertionError("the pending job was never dropped")


def test_registrations_that_never_complete_do_not_fill_the_job_table():
    with spawn(host="127.0.0.1", port=0, max_jobs=2, max_pending_jobs=3,
               pending_job_timeout=3.0, handshake_timeout=2.0) as d:
        strangers, told = [], []
        try:
            for _ in range(3):  # as many as one source may hold: admitted provisionally
                s, reply = _register_raw(d.address, _job(), 0, 2)
                assert reply["ok"], reply
                strangers.append(s)
            # each waits for its payload, as a rank would, until it is told
            waiting = [threading.Thread(target=lambda s=s: told.append(_told(s)))
                       for s in strangers]
            for t in waiting:
                t.start()
            s, reply = _register_raw(d.address, _job(), 0, 2)  # one more: refused, bounded
            s.close()
            assert not reply["ok"] and "3 jobs registered from 127.0.0.2 still wait for their " \
                "other ranks (at most 3 per source address, --max-pending-jobs" in reply["error"], \
                reply
            # Only admitted jobs count against --max-jobs: two real jobs (of two ranks,
            # from another address) still get in.
            real = []
            for _ in range(2):
                job = _job()
                pair = [None, None]
                t = threading.Thread(target=lambda: pair.__setitem__(
                    1, dataplane.connect(d.address, job, 1, 2, timeout=10.0)))
                t.start()
                pair[0] = dataplane.connect(d.address, job, 0, 2, timeout=10.0)
                t.join(30)
                real += pair
            with pytest.raises(AdmissionError, match="--max-jobs 2 jobs already admitted"):
                dataplane.connect(d.address, _job(), 0, 1, timeout=10.0)
            for conn in real:
                conn.close()
            # The pending ones expire: each stranger is told why, then closed.
            for t in waiting:
                t.join(90)
            assert len(told) == 3 and all("did not register within 3 s" in t["error"]
                                          for t in told), told
            with ControlConnection(d.address) as c:
                g = c.request(messages.Counters()).global_
            assert g["jobs_pending"] == 0 and g["jobs_active"] == 0, g
            assert g["jobs_refused_pending"] == 1 and g["jobs_max"] == 2, g
        finally:
            for s in strangers:
                s.close()
