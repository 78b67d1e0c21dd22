"""A slot's worker and repeat bits (native/aggregator/slot_pool.h): those of ranks 0..63
sit in the slot's own cache line, the others in words beside it. A job wider than 64
ranks must add each rank's contribution once, refuse its duplicate, and mark exactly
the ranks whose contribution came twice (repeat seen), on both sides of rank 64."""
from __future__ import annotations

import contextlib
import time
import uuid

import numpy as np

from netreduce import _native
from netreduce.protocol.client import ControlClient
from tests.raw_register import data_socket, jumbo_packet as _packet, register

I32 = 4  # _native dtype code of int32 (docs/protocol.md)
N = 70
TWICE = (3, 65)  # a rank in the slot's line and one beyond it send their chunk twice


def _counters_after(client, job: str, packets: int, limit_s: float = 10.0) -> dict:
    """The job's counters once the aggregator has taken ``packets`` datagrams (they
    were sent on UDP: the control port may answer before the data thread has read
    them)."""
    deadline = time.monotonic() + limit_s
    while True:
        c = client.call("counters")["jobs"][job]
        if c["packets_in"] >= packets or time.monotonic() > deadline:
            return c
        time.sleep(0.01)


def test_a_seventy_rank_round_adds_each_rank_once_and_marks_its_repeats(switch):
    job = "wide-" + uuid.uuid4().hex[:6]
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(ControlClient(switch.address)) for _ in range(N)]
        socks = [data_socket(c) for c in clients]
        for s in socks:
            stack.callback(s.close)
            s.settimeout(10)
        grants = [register(c, job, r, N, s) for r, (c, s) in enumerate(zip(clients, socks))]
        grant = grants[0]
        head = {"length": 64, "key": grant["key"], "slot": 2, "psn": 2, "msg_id": 5, "dtype": I32}
        dst = (switch.address[0], grant["data_port"])

        def send(r: int) -> None:
            data = np.full(16, r + 1, np.int32).tobytes()
            socks[r].sendto(_packet(dict(head, dest_qp=(grant["job_index"] << 12) | r), data), dst)

        for r in range(N - 1):
            send(r)
        for r in TWICE:
            send(r)
        c = _counters_after(clients[0], job, N - 1 + len(TWICE))
        assert c["duplicates"] == 2 and c["slots_completed"] == 0, c
        send(N - 1)  # completes the round: every rank gets the result
        want = np.full(16, N * (N + 1) // 2, np.int32)
        for r in range(N):
            pkt = socks[r].recv(65536)
            h = _native.decode_header(pkt)
            assert h["result"] and h["length"] == 64 and h["slot"] == 2, (r, h)
            assert bool(h["repeat_seen"]) == (r in TWICE), (r, h)
            np.testing.assert_array_equal(np.frombuffer(pkt[32:96], np.int32), want)
        c = clients[0].call("counters")["jobs"][job]
        assert c["slots_completed"] == 1 and c["bytes_reduced"] == N * 64, c
        assert c["duplicates"] == 2 and c["retransmitted_results"] == 0, c
