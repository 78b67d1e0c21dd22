"""A stranger on the data network captures a live job's contributions and replays them,
unchanged, from sockets of its own: the aggregator answers only the address each rank
registered, so the stranger gets nothing back, every replayed packet is dropped and
counted (bad_source), and the job stays exact (docs/operations.md, *Security*).

Capture needs root (an AF_PACKET socket on loopback, what tcpdump does)."""
from __future__ import annotations

import socket
import struct
import threading
import time
import uuid

import numpy as np
import pytest

from netreduce import _native
from netreduce.switch import spawn
from netreduce.worker import dataplane
from tests.conftest import require_root

pytestmark = pytest.mark.root
ETH_P_IP = 0x0800
CAPTURED = 40  # contributions the stranger keeps


def _capture(port: int, into: list, stop: threading.Event) -> None:
    """Contributions to UDP `port` on lo, as whole datagrams (UDP payload)."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
    s.bind(("lo", ETH_P_IP))
    s.settimeout(0.2)
    try:
        while not stop.is_set() and len(into) < CAPTURED:
            try:
                pkt, where = s.recvfrom(70000)
            except socket.timeout:
                continue
            if where[2] == socket.PACKET_OUTGOING or pkt[9] != socket.IPPROTO_UDP:
                continue  # (a send, where a kernel shows loopback packets twice)
            ihl = (pkt[0] & 0x0F) * 4
            dport = struct.unpack(">H", pkt[ihl + 2:ihl + 4])[0]
            data = pkt[ihl + 8:]
            if dport != port or len(data) < 32:
                continue
            h = _native.decode_header(data)
            if not h["result"] and len(data) == _native.datagram_bytes(h["length"]):
                into.append(data)  # a contribution, whole (not a GSO run)
    finally:
        s.close()


def _ranks(address, job, rounds, out, errors, leave):
    """Two ranks of `job` in threads, each `rounds` exact all-reduces; each puts its
    connection in `out` when done and stays in the job until `leave` is set."""
    def rank(r):
        try:
            with dataplane.connect(address, job, r, 2, timeout=30.0) as conn:
                for i in range(rounds):
                    a = np.full(1_000_000, (r + 1) * (i + 1), np.float32)
                    conn.allreduce(a)
                    assert (a == 3 * (i + 1)).all(), (r, i)
                out[r] = conn
                leave.wait(120)
        except BaseException as exc:  # reported by the test
            errors[r] = exc
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    return threads


def test_a_replay_from_an_unregistered_address_gets_nothing_and_is_counted():
    require_root()
    with spawn(host="127.0.0.1", port=0) as sw:
        job = "replay-" + uuid.uuid4().hex[:6]
        captured: list = []
        stop = threading.Event()
        sniffer = threading.Thread(target=_capture, args=(sw.address[1], captured, stop))
        sniffer.start()
        out: dict = {}
        errors: dict = {}
        leave = threading.Event()
        ranks = _ranks(sw.address, job, 30, out, errors, leave)
        # Two strangers: another port of the ranks' own address, another address.
        strangers = []
        for host in ("127.0.0.1", "127.0.0.2"):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((host, 0))
            strangers.append(s)
        replayed = 0
        answers: list = []
        try:
            sniffer.join(60)
            assert len(captured) == CAPTURED, f"captured {len(captured)} contributions"
            while len(out) + len(errors) < 2:  # while the job runs
                for pkt in captured:
                    for s in strangers:
                        s.sendto(pkt, sw.address)
                        replayed += 1
                time.sleep(0.005)
            assert not errors, errors  # every all-reduce exact
            deadline = time.monotonic() + 20
            while True:
                c = out[0].counters()["jobs"][job]
                if c["drop_bad_source"] >= replayed or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            # Every replayed packet reached the job and was dropped there, and nothing
            # came back: the daemon handled them all before these counters were read.
            for s in strangers:
                s.setblocking(False)
                try:
                    while True:
                        answers.append(s.recv(70000))
                except BlockingIOError:
                    pass
        finally:
            stop.set()
            leave.set()
            for t in ranks:
                t.join(60)
            for s in strangers:
                s.close()
    assert replayed > 0 and answers == [], (replayed, len(answers))
    assert c["drop_bad_source"] == replayed, (replayed, c)
    assert c["retransmitted_results"] <= c["duplicates"], c  # the ranks' own resends only
