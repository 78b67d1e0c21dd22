"""The control port under hostile input, against a real netreduce-switch on loopback:
malformed requests, a 100 MB line, half-open and idle connections, and 10,000
connections at once, while a legitimate 3-rank job runs and stays exact. Bounded in
count and time; loopback only."""
from __future__ import annotations

import json
import resource
import socket
import threading
import time
import uuid

import numpy as np
import pytest

from netreduce.testbed import proc_stat
from netreduce.worker import dataplane
from netreduce.protocol.client import ControlClient
from netreduce.switch import spawn
from tests.parallel.ranks import run_ranks
from tests.raw_wire import connect, greet

FLOOD = 10_000
IDLE_S = 2.0  # --handshake-timeout of the daemon under test


@pytest.fixture(scope="module")
def daemon():
    proc = spawn(host="127.0.0.1", port=0, extra_args=["--handshake-timeout", str(IDLE_S)])
    yield proc
    alive = proc.proc.poll() is None
    proc.stop()
    assert alive, "netreduce-switch died under hostile input"


def _ask(sock: socket.socket, line: bytes) -> dict:
    sock.sendall(line)
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {line[:60]!r}"
        buf += chunk
    return json.loads(buf)


MALFORMED = [
    b"not json\n",
    b"\xff\xfe\x00garbage\n",
    b"[1, 2, 3]\n",
    b'"a string"\n',
    b"null\n",
    b'{"cmd": 5}\n',
    b'{"cmd": "no-such-command"}\n',
    b'{"cmd": "register"}\n',
    b'{"cmd": "register", "job": "x", "rank": "zero", "size": 2}\n',
    b'{"cmd": "register", "job": "x", "rank": 0, "size": 1e400}\n',
    b'{"cmd": "register", "job": "x", "rank": 0, "size": ' + b"9" * 5000 + b"}\n",
    b'{"cmd": "register", "job": "x", "rank": 0, "size": 100000000}\n',
    b'{"cmd": "negotiate_abort"}\n',
    b'{"cmd": "counters", "operator": "00"}\n',
    b'{"cmd": "register", "job": "z", "rank": 0, "size": 1, "auth": 7}\n',
    b'{"cmd": "negotiate_hello", "job": "y", "rank": 0, "size": 3, "timeout": 0}\n',
    b"[" * 30000 + b"\n",  # deep enough to exhaust the parser's recursion
    b'{"cmd": "payload"}\n',
]


def test_malformed_requests_are_answered_and_the_connection_lives_on(daemon):
    with connect(daemon.address) as s:
        for line in MALFORMED:
            reply = _ask(s, line)
            assert reply["ok"] is False and reply["error"], (line[:60], reply)
            # refusals name the field, never the binding's internals (pybind11's text)
            assert "incompatible function arguments" not in reply["error"], reply
        assert _ask(s, b'{"cmd":"ping"}\n') == {"ok": True}


def test_a_refusal_names_the_command_and_the_field(daemon):
    with connect(daemon.address) as s:
        reply = _ask(s, b'{"cmd":"register","job":"x","rank":0,"size":1e308}\n')
        assert reply == {"ok": False, "error": "malformed 'register' request: Expected `int`, "
                                               "got `float` - at `$.size`"}, reply
        reply = _ask(s, b'{"cmd":"register","id":7,"job":"x","rank":0,"size":2,"mtu":-1}\n')
        assert reply["id"] == 7 and "at `$.mtu`" in reply["error"], reply
        assert "unknown command 'nope'" in _ask(s, b'{"cmd":"nope"}\n')["error"]


def test_a_100_mb_line_is_refused_without_reading_it_into_memory(daemon):
    pid = daemon.proc.pid
    before = proc_stat.status_int(pid, "VmRSS")
    s = socket.create_connection(daemon.address, timeout=10)
    chunk = b"x" * (1 << 20)
    sent = 0
    try:
        while sent < 100 << 20:
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # the daemon closed the connection after its limit: expected
    data = b""
    try:
        while True:
            part = s.recv(65536)
            if not part:
                break
            data += part
    except OSError:
        pass  # reset: the daemon closed with our bytes unread
    s.close()
    if data:
        assert b"longer than" in data, data[:200]
    assert sent < 100 << 20 or data, "the daemon swallowed 100 MB"
    assert proc_stat.status_int(pid, "VmRSS") < before + 32 * 1024, "a long line grew the daemon's memory"
    with ControlClient(daemon.address) as c:
        assert c.call("ping") == {}


def test_idle_and_half_open_connections_are_closed(daemon):
    idle = socket.create_connection(daemon.address, timeout=IDLE_S * 10)
    half = greet(socket.create_connection(daemon.address, timeout=IDLE_S * 10))
    half.sendall(b'{"cmd":"ping"')  # no newline, and no more from this side
    half.shutdown(socket.SHUT_WR)
    reply = half.recv(65536)
    assert reply and json.loads(reply)["ok"] is False  # the fragment is answered
    assert half.recv(65536) == b""  # then the daemon closes its side
    stalled = socket.create_connection(daemon.address, timeout=IDLE_S * 10)
    stalled.sendall(b'{"cmd":"pi')  # a line that never ends
    for sock in (idle, stalled):
        assert sock.recv(65536) == b""  # closed after --handshake-timeout of silence
        sock.close()
    half.close()


def _legit(rank, size, address, job, rounds):
    rng = np.random.default_rng(1234)  # the same sizes on every rank
    with dataplane.connect(address, job, rank, size, timeout=30.0) as conn:
        for i in range(rounds):
            n = int(rng.integers(1, 300_000))
            a = np.arange(n, dtype=np.int64) + rank * 1000 + i
            conn.allreduce(a)
            want = np.arange(n, dtype=np.int64) * size + (1000 * size * (size - 1) // 2) + i * size
            assert (a == want).all(), (i, n)
    return rounds


def test_ten_thousand_connections_at_once_while_a_job_stays_exact(daemon):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < FLOOD + 1000:
        pytest.skip(f"needs RLIMIT_NOFILE >= {FLOOD + 1000} (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pid = daemon.proc.pid
    socks, errors = [], []
    done = threading.Event()

    def flood():
        try:
            for i in range(FLOOD):
                s = socket.create_connection(daemon.address, timeout=30)
                if i % 3 == 1:
                    s.sendall(b'{"cmd":"regis')  # a request that never ends
                elif i % 3 == 2:
                    s.sendall(b"\x00" * 100 + b"\n")  # garbage, answered, then idle
                socks.append(s)
        except OSError as exc:
            errors.append(exc)
        finally:
            done.set()

    try:
        t = threading.Thread(target=flood)
        t.start()
        while len(socks) < 500 and not done.is_set():
            time.sleep(0.01)  # the flood is under way before the job starts
        job = "legit-" + uuid.uuid4().hex[:6]
        at_start = len(socks)
        assert run_ranks(_legit, 3, daemon.address, job, 30, timeout=300) == [30] * 3
        print(f"flood: {at_start} connections open when the job started, {len(socks)} when "
              f"it ended, threads in the daemon {proc_stat.status_int(pid, 'Threads')}")
        t.join(300)
        assert not errors, errors[:3]
        assert len(socks) == FLOOD
        # Unbound connections are capped (--max-pending, default 1024): the daemon shut
        # the oldest down instead of holding 10,000 threads.
        assert proc_stat.status_int(pid, "Threads") < 1024 + 64
        closed = 0
        for s in socks[:FLOOD // 2]:
            s.settimeout(IDLE_S * 10)
            try:
                while s.recv(65536):
                    pass
                closed += 1
            except OSError:
                closed += 1
        assert closed == FLOOD // 2
    finally:
        for s in socks:
            s.close()
    with ControlClient(daemon.address) as c:
        assert c.call("counters")["global"]["jobs_active"] == 0
