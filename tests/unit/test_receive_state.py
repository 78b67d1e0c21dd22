"""The aggregator's per-receive checks (native/aggregator/receive_state.h): the job
lookup and the key, rank and source checks are done once per run of one rank's
datagrams in a receive, not per datagram -- and nothing a user relies on moves: a
stranger's datagram in the middle of a rank's run gets nothing, a rebinding or a
removed job counts from the next datagram on, and every receive stores its rank's
address again, so that one data thread's receive repairs what another's left
(rank_address.h: two threads receiving one rank). Driven by hand through
Aggregator.receive_script, the datagrams as data threads would take them."""
from __future__ import annotations

import struct

import pytest

from netreduce.switch.settings import aggregator_args

_native = pytest.importorskip("netreduce._native")

from tests.raw_register import jumbo_packet  # noqa: E402

KEY = 0x5EC
LOCAL = "127.0.0.1"
F32 = 0  # dtype code
SUM = 0  # op code


def _datagram(job: int, rank: int, slot: int, psn: int, key: int = KEY) -> bytes:
    payload = struct.pack("<4f", *([float(rank + 1)] * 4))
    return jumbo_packet({"dest_qp": (job << 12) | rank, "psn": psn, "slot": slot,
                         "key": key, "length": len(payload), "dtype": F32, "op": SUM,
                         "offset": slot * 4, "msg_id": 1, "udp_checksum": 1}, payload)


def _step(receive: int, thread: int, packet: bytes, port: int, host: str = LOCAL):
    """``packet`` from host:port, in receive number ``receive`` of data thread ``thread``."""
    return ("datagram", receive, thread, packet, host, port, LOCAL)


def _aggregator(threads: int = 1):
    agg = _native.Aggregator(**aggregator_args(host=LOCAL, port=4791, threads=threads,
                                               fanout="unicast"))
    job = agg.add_job(2, KEY, 1024)
    return agg, job


def test_a_strangers_datagram_inside_a_ranks_run_gets_nothing():
    agg, job = _aggregator()
    agg.bind_rank(job, 0, LOCAL, 5000)
    agg.bind_rank(job, 1, LOCAL, 5001)
    sent = agg.receive_script([
        _step(0, 0, _datagram(job, 0, 0, 0), 5000),
        _step(0, 0, _datagram(job, 0, 0, 0), 6000),  # rank 0's, replayed from port 6000
        _step(0, 0, _datagram(job, 0, 1, 1), 5000),
        _step(0, 0, _datagram(job, 0, 2, 2, key=KEY + 1), 5000),  # a wrong key
        _step(0, 0, _datagram(job, 1, 0, 0), 5001),  # completes slot 0
        _step(0, 0, _datagram(job, 0, 0, 0), 5000),  # rank 0's resend: the stored result
        _step(0, 0, _datagram(job, 0, 0, 0), 6000),  # the stranger's replay of it
        _step(0, 0, _datagram(job, 0, 0, 0), 5000, host="127.0.0.2"),  # another host
    ])
    assert sent == [[], [], [], [], ["127.0.0.1:5000", "127.0.0.1:5001"], ["127.0.0.1:5000"],
                    [], []]
    c = agg.job_counters(job)
    assert c["drop_bad_source"] == 3 and c["drop_bad_key"] == 1, c
    assert c["slots_completed"] == 1 and c["bytes_reduced"] == 3 * 16, c


def test_a_rebinding_or_a_removal_counts_from_the_next_datagram_of_a_receive():
    agg, job = _aggregator()
    agg.bind_rank(job, 0, LOCAL, 5000)
    agg.bind_rank(job, 1, LOCAL, 5001)
    sent = agg.receive_script([
        _step(0, 0, _datagram(job, 0, 0, 0), 5000),
        ("bind", job, 0, LOCAL, 5002, 1),          # the rank moved to port 5002
        _step(0, 0, _datagram(job, 0, 1, 1), 5000),  # so this one is a stranger's
        _step(0, 0, _datagram(job, 0, 1, 1), 5002),
        _step(0, 0, _datagram(job, 1, 1, 1), 5001),
    ])
    assert sent == [[], [], [], [], ["127.0.0.1:5002", "127.0.0.1:5001"]]
    c = agg.job_counters(job)
    assert c["drop_bad_source"] == 1 and c["slots_completed"] == 1, c
    before = agg.counters()["drop_unknown_job"]
    sent = agg.receive_script([
        _step(0, 0, _datagram(job, 0, 2, 2), 5002),
        ("remove", job),
        _step(0, 0, _datagram(job, 0, 3, 3), 5002),
    ])
    assert sent == [[], [], []]
    assert agg.counters()["drop_unknown_job"] == before + 1


def test_every_receive_stores_its_ranks_address_again():
    """Rank 0 sends from two bound ports, one to each data thread (a rack aggregator's
    threads towards a spine). A receive of thread 1 moves the rank's address to its
    port while thread 0's receive goes on: thread 0's next receive moves it back, and
    the results a slot of thread 0 then completes go where that receive saw the rank."""
    agg, job = _aggregator(threads=2)
    agg.bind_rank(job, 0, LOCAL, 5000, 2)
    agg.bind_rank(job, 1, LOCAL, 5010)
    sent = agg.receive_script([
        _step(0, 0, _datagram(job, 0, 0, 0), 5000),  # receive 0 on thread 0
        _step(1, 1, _datagram(job, 0, 1, 1), 5001),  # receive 1 on thread 1
        _step(0, 0, _datagram(job, 0, 2, 2), 5000),  # receive 0 goes on
        _step(2, 0, _datagram(job, 0, 4, 4), 5000),  # thread 0's next receive
        _step(2, 0, _datagram(job, 1, 4, 4), 5010),
        _step(3, 1, _datagram(job, 0, 3, 3), 5001),  # thread 1's next receive
        _step(3, 1, _datagram(job, 1, 3, 3), 5010),
        _step(3, 1, _datagram(job, 0, 5, 5), 5000),  # the rank's other port, same receive
        _step(3, 1, _datagram(job, 1, 5, 5), 5010),
    ])
    assert sent[3:] == [[], ["127.0.0.1:5000", "127.0.0.1:5010"],
                        [], ["127.0.0.1:5001", "127.0.0.1:5010"],
                        [], ["127.0.0.1:5000", "127.0.0.1:5010"]]
    c = agg.job_counters(job)
    assert c["drop_bad_source"] == 0 and c["slots_completed"] == 3, c
