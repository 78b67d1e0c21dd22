"""Faults the data plane must survive or report: malformed and hostile packets,
an unreachable or dead aggregator, admission limits, SIGTERM."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

from netreduce import _native, dataplane
from netreduce.control.client import ControlClient
from netreduce.errors import AdmissionError, ControlPlaneError, DataPlaneError
from netreduce.switch import spawn
from tests.parallel.ranks import run_ranks


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _packet(fields: dict, payload: bytes, icrc: bytes = b"\0\0\0\0") -> bytes:
    pad = (-len(payload)) % 4
    return _native.encode_header(fields) + payload + b"\0" * pad + icrc


def _job_ranks(rank, size, address, job, rounds):
    with dataplane.connect(address, job, rank, size, timeout=20.0) as conn:
        for _ in range(rounds):
            a = np.full(200_000, rank + 1, dtype=np.int32)
            conn.allreduce(a)
            assert (a == size * (size + 1) // 2).all()
        return conn.counters()["jobs"][job]


def test_hostile_packets_are_dropped_and_counted_while_a_job_runs(switch):
    job = "victim-" + uuid.uuid4().hex[:6]
    address = switch.address
    # Learn the job's index and key as rank 0 would, through a registration of our
    # own in a separate job, then aim packets at the victim's index with a wrong key.
    probe = ControlClient(address)  # held open: closing it would end the attacker's job
    other = probe.call("register", job="attacker-" + job, rank=0, size=1)
    payload = np.ones(16, np.float32).tobytes()
    jumbo = {"jumbo": 1, "length": len(payload), "dtype": 0, "op": 0}

    stop = threading.Event()

    def attack():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        dst = (address[0], other["data_port"])
        victim_qp = lambda rank: ((other["job_index"] + 1) << 12) | rank  # noqa: E731
        while not stop.is_set():
            # wrong key for the victim job (index next to ours)
            s.sendto(_packet(dict(jumbo, dest_qp=victim_qp(0), key=12345), payload), dst)
            # right key of our own job, rank out of range
            s.sendto(_packet(dict(jumbo, dest_qp=(other["job_index"] << 12) | 7, key=other["key"]), payload), dst)
            # truncated header
            s.sendto(b"\x2b\x00\xff\xff", dst)
            # DMA length disagrees with the datagram
            s.sendto(_packet(dict(jumbo, dest_qp=other["job_index"] << 12, key=other["key"], length=999), payload), dst)
            # unknown dtype code
            s.sendto(_packet(dict(jumbo, dest_qp=other["job_index"] << 12, key=other["key"], dtype=9), payload), dst)
            time.sleep(0.001)
        s.close()

    t = threading.Thread(target=attack)
    t.start()
    try:
        run_ranks(_job_ranks, 3, address, job, 20)
    finally:
        stop.set()
        t.join()
        probe.close()
    with ControlClient(address) as c:
        g = c.call("counters")["global"]
    for reason in ("bad_rank", "truncated", "bad_length", "bad_dtype"):
        assert g["drop_" + reason] > 0, reason
    assert g["drop_bad_key"] + g["drop_unknown_job"] > 0


def test_wrong_key_on_a_live_job_is_counted_on_that_job(switch):
    job = "keyed-" + uuid.uuid4().hex[:6]
    with ControlClient(switch.address) as rank0:
        grant = rank0.call("register", job=job, rank=0, size=2)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        payload = b"\0" * 64
        pkt = _packet({"jumbo": 1, "length": 64, "dest_qp": grant["job_index"] << 12,
                       "key": grant["key"] ^ 1}, payload)
        for _ in range(5):
            s.sendto(pkt, (switch.address[0], grant["data_port"]))
        s.close()
        deadline = time.time() + 5
        while time.time() < deadline:
            c = rank0.call("counters")["jobs"][job]
            if c["drop_bad_key"] >= 5:
                break
            time.sleep(0.05)
        assert c["drop_bad_key"] == 5 and c["bytes_reduced"] == 0


def test_unreachable_aggregator_fails_fast_with_its_address():
    port = _free_port()
    start = time.monotonic()
    with pytest.raises(ControlPlaneError, match=f"127.0.0.1:{port}"):
        dataplane.connect(("127.0.0.1", port), "nobody", 0, 2, timeout=3.0)
    assert time.monotonic() - start < 10


def _lonely_rank(rank, size, address, job, timeout):
    with dataplane.connect(address, job, rank, size, timeout=timeout) as conn:
        start = time.monotonic()
        try:
            conn.allreduce(np.ones(100_000, np.float32))
        except DataPlaneError as exc:
            return str(exc), time.monotonic() - start
        return "no error", time.monotonic() - start


def test_missing_rank_times_out_naming_aggregator_job_and_slot(switch):
    # World size 2 but only rank 0 ever sends: the slot never completes.
    job = "half-" + uuid.uuid4().hex[:6]
    with ControlClient(switch.address) as ghost:
        ghost.call("register", job=job, rank=1, size=2)
        (msg, elapsed), = run_ranks(lambda r, s, *a: _lonely_rank(0, 2, *a), 1, switch.address, job, 1.5)
    assert "no result from the aggregator" in msg
    assert f"{switch.address[0]}:" in msg and job in msg and "slot" in msg and "rank 0/2" in msg
    assert elapsed < 1.5 + 5


def test_dead_aggregator_gives_an_error_not_a_hang():
    sw = spawn()
    job = "orphan-" + uuid.uuid4().hex[:6]
    conn = dataplane.connect(sw.address, job, 0, 1, timeout=2.0)
    a = np.ones(1000, np.float32)
    conn.allreduce(a)
    os.killpg(sw.proc.pid, signal.SIGKILL)
    sw.proc.wait()
    start = time.monotonic()
    with pytest.raises(DataPlaneError, match="no result from the aggregator"):
        conn.allreduce(np.ones(10**6, np.float32))
    assert time.monotonic() - start < 2.0 + 5
    with pytest.raises(DataPlaneError, match="earlier failure"):
        conn.allreduce(a)  # the job is out of step now: refused, clearly
    conn.close()
    sw.stop()


def test_abort_fails_pending_operation(switch):
    job = "abort-" + uuid.uuid4().hex[:6]
    with ControlClient(switch.address) as ghost:
        ghost.call("register", job=job, rank=1, size=2)
        with dataplane.connect(switch.address, job, 0, 2, timeout=30.0) as conn:
            req = conn.allreduce_async(np.ones(1000, np.float32))
            time.sleep(0.2)
            assert not req.done()
            conn.abort("rank 1 left the job")
            with pytest.raises(DataPlaneError, match="rank 1 left the job"):
                req.wait()


def test_admission_limits_are_refused_cleanly():
    with spawn(max_jobs=1) as sw:
        with dataplane.connect(sw.address, "first", 0, 1):
            with pytest.raises(AdmissionError, match="max-jobs 1"):
                dataplane.connect(sw.address, "second", 0, 1)
        # the first job's pool was freed on close: a new job fits again
        with dataplane.connect(sw.address, "third", 0, 1) as conn:
            conn.allreduce(np.ones(3, np.float32))
    with spawn(slots=64, payload_bytes=65464, memory_mb=1) as sw:
        with pytest.raises(AdmissionError, match="memory exhausted"):
            dataplane.connect(sw.address, "big", 0, 1)
    with spawn() as sw:
        with dataplane.connect(sw.address, "sized", 0, 2):
            with pytest.raises(AdmissionError, match="world size 3"):
                dataplane.connect(sw.address, "sized", 1, 3)
            with pytest.raises(AdmissionError, match="already registered"):
                dataplane.connect(sw.address, "sized", 0, 2)


def test_sigterm_stops_the_daemon_cleanly():
    sw = spawn()
    sw.proc.terminate()
    assert sw.proc.wait(10) == 0
    sw.stop()


def test_help_explains_every_option():
    out = subprocess.run([sys.executable, "-m", "netreduce.switch", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for flag in ("--host", "--port", "--slots", "--payload-bytes", "--max-jobs", "--threads",
                 "--memory-mb"):
        assert flag in out
    assert "shadow" in out and "RoCE" in out


def test_bad_daemon_arguments_are_reported():
    r = subprocess.run([sys.executable, "-m", "netreduce.switch", "--port", "0",
                        "--payload-bytes", "100"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "multiple of 8" in r.stderr


def test_threads_shard_slots_across_ports():
    with spawn(threads=2) as sw:
        stats = run_ranks(lambda r, s, a, j: _job_ranks(r, s, a, j, 3), 2, sw.address, "sharded")
        assert stats[0]["drop_bad_slot"] == 0
