"""The control port's event loop keeps nothing of a job once its requests are
answered: a wait answered before its deadline (a hello that waited for the other
rank, with the start timeout as deadline) stays in the timer heap until then, and
used to hold the job's negotiation state and the request through its poll closure,
so a job restarted every few milliseconds grew the daemon by ~14 KiB per restart
(issue 14, soak: aggregator RSS flat)."""
from __future__ import annotations

import gc
import json
import socket
import threading
import time
import uuid
import weakref

from netreduce.switch import coordinator
from netreduce.switch.server import ControlServer
from tests.raw_wire import connect, read_line as _reply


def _line(sock: socket.socket, msg: dict) -> None:
    sock.sendall(json.dumps(msg).encode() + b"\n")


def _hello(srv: ControlServer, job: str, rank: int) -> socket.socket:
    s = connect(srv.server_address)
    _line(s, {"cmd": "negotiate_hello", "job": job, "rank": rank, "size": 2,
              "role": "poll", "timeout": 600})
    return s


def _serve() -> ControlServer:
    srv = ControlServer("127.0.0.1", 0, aggregator=None)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return srv


def _gone(srv: ControlServer, ref: weakref.ref, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        # The loop thread's last selector key names the last connection it served
        # until the next event: serve another one, then look.
        with connect(srv.server_address) as s:
            _line(s, {"cmd": "ping"})
            assert _reply(s)["ok"]
        time.sleep(0.05)
        gc.collect()
        if ref() is None:
            return True
        time.sleep(0.05)
    return False


def test_a_finished_job_leaves_no_state_behind_its_answered_waits():
    srv = _serve()
    try:
        job = "mem-" + uuid.uuid4().hex[:6]
        first = _hello(srv, job, 0)        # parked: waits (deadline 600 s) for rank 1
        deadline = time.monotonic() + 10
        while job not in coordinator._jobs(srv):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        state = weakref.ref(coordinator._jobs(srv)[job])
        second = _hello(srv, job, 1)       # both answered now, long before the deadline
        assert _reply(first)["ok"] and _reply(second)["ok"]
        assert srv.loop.timers, "the first hello's deadline is in the timer heap"
        first.close()
        second.close()
        assert _gone(srv, state, within=5.0), \
            "the job's negotiation state outlived the job (held by an answered wait)"
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_timer_heap_does_not_grow_with_answered_waits():
    srv = _serve()
    try:
        socks = []
        for i in range(400):  # 400 short jobs, each with a 600 s hello deadline
            job = f"heap-{i}-{uuid.uuid4().hex[:4]}"
            a = _hello(srv, job, 0)
            time.sleep(0.002)  # let it park first (a timer entry), as in a real start
            b = _hello(srv, job, 1)
            assert _reply(a)["ok"] and _reply(b)["ok"]
            socks += [a, b]
            if len(socks) > 40:
                for s in socks:
                    s.close()
                socks = []
        # Finished waits are swept once they outnumber the live ones: bounded by a
        # constant, not by the jobs that have come and gone.
        assert len(srv.loop.timers) <= 2 * 256 + 40, len(srv.loop.timers)
        for s in socks:
            s.close()
    finally:
        srv.shutdown()
        srv.server_close()
