"""Where each (slot, shadow) keeps its accumulator (native/aggregator/slot_pool.h): the
two shadow sets lie one after the other, slot after slot, each with room for a result
datagram built in place around it. Full-length rounds on both shadows of the first two
slots and of the last one, all completed before any is asked again, must each keep its
own sum: a late duplicate is answered with that round's stored result, byte for byte."""
from __future__ import annotations

import contextlib
import uuid

import numpy as np

from netreduce import _native
from netreduce.protocol.client import ControlClient
from tests.raw_register import data_socket, jumbo_packet as _packet, register

F32 = 0  # _native dtype code of float32 (docs/protocol.md)


def test_both_shadows_of_first_and_last_slots_keep_their_own_results(switch):
    job = "layout-" + uuid.uuid4().hex[:6]
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(ControlClient(switch.address)) for _ in range(2)]
        socks = [data_socket(c) for c in clients]
        for s in socks:
            stack.callback(s.close)
            s.settimeout(10)
        grants = [register(c, job, r, 2, s) for r, (c, s) in enumerate(zip(clients, socks))]
        grant = grants[1]  # the last to register: the job's payload and slots are set
        payload, slots = grant["payload_bytes"], grant["slots"]
        assert payload >= 8 and slots >= 3, grant
        dst = (switch.address[0], grant["data_port"])
        n = payload // 4
        places = [(0, 0), (0, 1), (1, 0), (1, 1), (slots - 1, 0), (slots - 1, 1)]

        def values(i: int, r: int) -> np.ndarray:  # distinct per round and rank, exact sums
            return (np.arange(n, dtype=np.float32) % 1024) + np.float32(1000 * (i + 1) + r)

        def send(i: int, r: int) -> None:
            slot, shadow = places[i]
            head = {"length": payload, "key": grant["key"], "slot": slot, "shadow": shadow,
                    "psn": 7 + i, "msg_id": 3, "dtype": F32, "offset": i * n,
                    "dest_qp": (grant["job_index"] << 12) | r}
            socks[r].sendto(_packet(head, values(i, r).tobytes()), dst)

        def result(r: int) -> tuple:
            pkt = socks[r].recv(65536)
            h = _native.decode_header(pkt)
            assert h["result"] and h["length"] == payload, h
            return (h["slot"], h["shadow"]), np.frombuffer(pkt[32:32 + payload], np.float32)

        for i in range(len(places)):  # every round completes: both ranks get its result
            send(i, 0)
            send(i, 1)
            for r in range(2):
                where, got = result(r)
                assert where == places[i], (where, places[i])
                np.testing.assert_array_equal(got, values(i, 0) + values(i, 1))
        for i in range(len(places)):  # each asked again, after all the others were written
            send(i, 0)
            where, got = result(0)
            assert where == places[i], (where, places[i])
            np.testing.assert_array_equal(got, values(i, 0) + values(i, 1))
