"""The aggregator's side of verbs peers, without an RDMA stack: hand-made requests
as a UC queue pair's NIC would send them (round PSN and chunk in RETH.VA, the NIC's
own BTH PSN, an ICRC the aggregator cannot check), a UDP rank in the same job, and
the results checked field by field as a NIC's responder would before accepting
them. The whole path against a real NIC (Soft-RoCE) is tests/softroce."""
from __future__ import annotations

import socket
import struct

import numpy as np
import pytest

from netreduce import _native
from netreduce.switch.settings import aggregator_args
from tests.softroce import roce_pcap

AGG, PEER, UDP_RANK = "127.77.0.2", "127.77.0.1", "127.77.0.3"
P = 992                      # payload bytes (rxe's 1024 B MTU less the result header)
CHUNK = P // 4               # float32 elements per chunk
RING_VA, RKEY, ENTRIES, STRIDE = 0x7F0012340000, 0xABCDE, 8, 1024
WORKER_QPN = 0x11A


def _be(ip: str) -> int:
    return struct.unpack("<I", socket.inet_aton(ip))[0]


@pytest.fixture
def agg():
    a = _native.Aggregator(**aggregator_args(host=AGG, port=4791, threads=1, payload_bytes=P))
    try:
        a.start()
    except _native.EngineError as exc:
        pytest.skip(f"cannot bind {AGG}:4791: {exc}")
    yield a
    a.stop()


def _sock(ip: str, port: int = 0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, port))
    s.settimeout(5.0)
    return s


def _request(index, rank, key, round_psn, chunk, values, nic_psn=None, msg_id=7, op=0):
    """The packet a verbs worker's NIC sends (nic_psn set) or a UDP rank sends."""
    payload = values.astype(np.float32).tobytes()
    verbs = nic_psn is not None
    hdr = _native.encode_header(dict(
        dest_qp=(index << 12) | rank, psn=nic_psn if verbs else round_psn, dtype=0, op=op,
        shadow=0, slot=chunk % 4, key=key, length=len(payload), msg_id=msg_id,
        offset=(round_psn << 16 | chunk) if verbs else chunk * CHUNK))
    return hdr, payload


def test_results_to_a_verbs_peer_are_what_its_nic_accepts(agg):
    index = agg.add_job(2, 0x5EED, P)
    udp = _sock(UDP_RANK)
    # Each rank's data address, as it registered (a verbs rank's UDP socket, which its
    # queue pair's address then replaces, any port: its NIC picks the source port).
    agg.bind_rank(index, 0, PEER, 40000)
    agg.bind_rank(index, 1, UDP_RANK, udp.getsockname()[1])
    first_psn = agg.attach_verbs_peer(index, 0, PEER, WORKER_QPN, RING_VA, RKEY, ENTRIES, STRIDE)
    assert agg.rank_source(index, 0) == f"{PEER} (any port)"
    try:
        nic = _sock(PEER, 4791)   # where the aggregator answers the verbs peer: its RoCEv2 port
    except OSError as exc:
        udp.close()
        pytest.skip(f"cannot bind {PEER}:4791 (a daemon holds the wildcard?): {exc}")
    try:
        sent = {}
        for k, chunk in enumerate((0, 1)):
            a = np.arange(CHUNK, dtype=np.float32) + chunk
            b = np.full(CHUNK, 100.0 * (chunk + 1), dtype=np.float32)
            sent[chunk] = a + b
            h0, p0 = _request(index, 0, 0x5EED, 500 + chunk, chunk, a, nic_psn=9000 + 3 * k)
            nic.sendto(h0 + p0 + b"\0\0\0\0", (AGG, 4791))  # ICRC: not checkable, not checked
            h1, p1 = _request(index, 1, 0x5EED, 500 + chunk, chunk, b)
            sport = udp.getsockname()[1]
            icrc = _native.compute_icrc(_be(UDP_RANK), _be(AGG), socket.htons(sport),
                                        socket.htons(4791), h1, p1, 0)
            udp.sendto(h1 + p1 + struct.pack("<I", icrc), (AGG, 4791))
        for k, chunk in enumerate((0, 1)):
            pkt, src = nic.recvfrom(4096)
            assert src == (AGG, 4791)
            # BTH: UC RDMA WRITE Only with Immediate to the worker's QP, the aggregator's
            # consecutive PSNs from the one verbs_connect gave; no pad (992 % 4 == 0).
            assert pkt[0] == 0x2B and pkt[1] == 0 and pkt[2:4] == b"\xff\xff"
            assert int.from_bytes(pkt[5:8], "big") == WORKER_QPN
            assert int.from_bytes(pkt[9:12], "big") == (first_psn + k) & 0xFFFFFF
            va, rkey, dmalen, imm = struct.unpack(">QIII", pkt[12:32])
            assert (va, rkey, imm) == (RING_VA + k * STRIDE, RKEY, k) and dmalen == 32 + P
            inner = _native.decode_header(pkt[32:32 + 32 + P] + b"\0\0\0\0")
            assert inner["result"] and inner["psn"] == 500 + chunk and inner["offset"] == chunk * CHUNK
            assert inner["dest_qp"] == index << 12 and inner["msg_id"] == 7
            got = np.frombuffer(pkt[64:64 + P], dtype=np.float32)
            assert np.array_equal(got, sent[chunk])
            # ICRC as the NIC checks it: IPv4 with ID 0 and DF (the aggregator's socket).
            udp_len = 8 + len(pkt)
            ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0x4000, 64, 17, 0,
                             socket.inet_aton(AGG), socket.inet_aton(PEER))
            assert roce_pcap.icrc_ok(ip, struct.pack(">HHHH", 4791, 4791, udp_len, 0), pkt)
            # The UDP rank in the same job gets the ordinary result.
            r, _ = udp.recvfrom(4096)
            h = _native.decode_header(r)
            assert h["result"] and h["psn"] == 500 + chunk
            assert np.array_equal(np.frombuffer(r[32:32 + P], dtype=np.float32), sent[chunk])
    finally:
        nic.close()
        udp.close()


def test_nan_of_a_verbs_peer_or_a_udp_rank_reaches_both_as_numpy_has_it(agg):
    """Max with NaN held by the verbs rank, by the UDP rank, by both: NaN at each of
    those places in both ranks' results, whichever came first (np.maximum)."""
    index = agg.add_job(2, 0x5EED, P)
    udp = _sock(UDP_RANK)
    agg.bind_rank(index, 0, PEER, 40000)
    agg.bind_rank(index, 1, UDP_RANK, udp.getsockname()[1])
    agg.attach_verbs_peer(index, 0, PEER, WORKER_QPN, RING_VA, RKEY, ENTRIES, STRIDE)
    try:
        nic = _sock(PEER, 4791)
    except OSError as exc:
        udp.close()
        pytest.skip(f"cannot bind {PEER}:4791 (a daemon holds the wildcard?): {exc}")
    try:
        k = np.arange(CHUNK) % 3
        a = np.where(k == 0, np.nan, np.arange(CHUNK, dtype=np.float32))
        b = np.where(k == 1, np.nan, np.float32(100.0))
        b[::7] = np.nan
        want = np.maximum(a, b).astype(np.float32)
        for k, first in enumerate(("verbs", "udp")):  # each rank's packet first in turn
            h0, p0 = _request(index, 0, 0x5EED, 600 + k, k, a, nic_psn=9100 + k, op=2)
            h1, p1 = _request(index, 1, 0x5EED, 600 + k, k, b, op=2)
            sport = udp.getsockname()[1]
            icrc = _native.compute_icrc(_be(UDP_RANK), _be(AGG), socket.htons(sport),
                                        socket.htons(4791), h1, p1, 0)
            sends = [(nic, h0 + p0 + b"\0\0\0\0"), (udp, h1 + p1 + struct.pack("<I", icrc))]
            for sock, pkt in (sends if first == "verbs" else sends[::-1]):
                sock.sendto(pkt, (AGG, 4791))
            pkt, _ = nic.recvfrom(4096)
            got_verbs = np.frombuffer(pkt[64:64 + P], dtype=np.float32)
            r, _ = udp.recvfrom(4096)
            got_udp = np.frombuffer(r[32:32 + P], dtype=np.float32)
            for got in (got_verbs, got_udp):
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=first)
                np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    finally:
        nic.close()
        udp.close()


def test_a_verbs_peer_is_refused_where_a_nic_could_not_reach_it():
    # two data threads (a NIC sends every packet to one port), then one thread on a data
    # port other than RoCEv2's 4791
    for threads, refusal in ((2, "--threads 1"), (1, "4791")):
        a = _native.Aggregator(**aggregator_args(host="127.0.0.1", port=0, threads=threads))
        a.start()
        try:
            index = a.add_job(1, 1, 0)
            with pytest.raises(ValueError, match=refusal):
                a.attach_verbs_peer(index, 0, PEER, WORKER_QPN, RING_VA, RKEY, ENTRIES, STRIDE)
        finally:
            a.stop()


def test_a_queue_pair_on_another_address_than_the_rank_registered_is_refused(agg):
    index = agg.add_job(1, 1, P)
    agg.bind_rank(index, 0, UDP_RANK, 40000)
    with pytest.raises(ValueError, match=f"queue pair is on {PEER}, but the rank registered the "
                                         f"data address {UDP_RANK}:40000"):
        agg.attach_verbs_peer(index, 0, PEER, WORKER_QPN, RING_VA, RKEY, ENTRIES, STRIDE)


def test_a_result_ring_too_small_for_the_payload_is_refused(agg):
    index = agg.add_job(1, 1, P)
    agg.bind_rank(index, 0, PEER, 40000)
    with pytest.raises(ValueError, match="cannot hold results"):
        agg.attach_verbs_peer(index, 0, PEER, WORKER_QPN, RING_VA, RKEY, ENTRIES, P)
    with pytest.raises(ValueError, match="already attached"):
        agg.attach_verbs_peer(index, 0, PEER, WORKER_QPN, RING_VA, RKEY, ENTRIES, STRIDE)
        agg.attach_verbs_peer(index, 0, PEER, WORKER_QPN, RING_VA, RKEY, ENTRIES, STRIDE)


def _rc_request(index, key, round_psn, chunk, values, nic_psn):
    hdr, payload = _request(index, 0, key, round_psn, chunk, values, nic_psn=nic_psn)
    hdr = bytes([0x0B]) + hdr[1:8] + bytes([0x80]) + hdr[9:]  # RC WRITE Only Imm, AckReq
    return hdr + payload + b"\0\0\0\0"


def _aeth(pkt):
    assert pkt[0] == 0x11 and int.from_bytes(pkt[5:8], "big") == WORKER_QPN  # Acknowledge
    return int.from_bytes(pkt[9:12], "big"), pkt[12], int.from_bytes(pkt[13:16], "big")


def test_rc_peer_gets_acks_naks_and_go_back_n_results(agg):
    """The aggregator as an RC responder (ACK, duplicate re-ACK, one sequence NAK per
    gap) and requester (AckReq on results, resend from a NAKed PSN)."""
    index = agg.add_job(1, 0x5EED, P)
    agg.bind_rank(index, 0, PEER, 40000)  # as it registered: its queue pair's address
    first_psn = agg.attach_verbs_peer(index, 0, PEER, WORKER_QPN, RING_VA, RKEY, ENTRIES,
                                      STRIDE, rc=True, worker_psn=100)
    try:
        nic = _sock(PEER, 4791)
    except OSError as exc:
        pytest.skip(f"cannot bind {PEER}:4791: {exc}")
    try:
        ones = np.ones(CHUNK, dtype=np.float32)

        def recv_all(n):
            return [nic.recvfrom(4096)[0] for _ in range(n)]

        def results(n):  # the next n results; ACKs (coalesced: one or more) set aside
            got, acks = [], []
            while len(got) < n:
                pkt = nic.recvfrom(4096)[0]
                (got if pkt[0] == 0x0B else acks).append(pkt)
            return got, acks

        nic.sendto(_rc_request(index, 0x5EED, 700, 0, ones, nic_psn=100), (AGG, 4791))
        got = recv_all(2)
        acks = [p for p in got if p[0] == 0x11]
        res = [p for p in got if p[0] == 0x0B]
        assert len(acks) == 1 and _aeth(acks[0]) == (100, 0x1F, 1)  # ACK, MSN 1
        assert len(res) == 1 and res[0][8] & 0x80  # RC result asks for an ACK
        assert int.from_bytes(res[0][9:12], "big") == first_psn
        # The NIC resends PSN 100 (our ACK "was lost"): acknowledged again, not reduced.
        nic.sendto(_rc_request(index, 0x5EED, 700, 0, ones, nic_psn=100), (AGG, 4791))
        assert _aeth(recv_all(1)[0]) == (100, 0x1F, 1)
        # PSN 102 while 101 is expected: one NAK (sequence error) naming 101, twice sent.
        for _ in range(2):
            nic.sendto(_rc_request(index, 0x5EED, 701, 1, ones, nic_psn=102), (AGG, 4791))
        assert _aeth(recv_all(1)[0]) == (101, 0x60, 1)
        nic.settimeout(0.05)
        with pytest.raises(socket.timeout):
            nic.recvfrom(4096)
        nic.settimeout(5.0)
        # 101 then 102: both taken, both results sent (PSNs first+1, first+2).
        nic.sendto(_rc_request(index, 0x5EED, 701, 1, ones, nic_psn=101), (AGG, 4791))
        nic.sendto(_rc_request(index, 0x5EED, 702, 2, ones, nic_psn=102), (AGG, 4791))
        got, acks = results(2)
        psns = sorted(int.from_bytes(p[9:12], "big") for p in got)
        assert psns == [(first_psn + 1) & 0xFFFFFF, (first_psn + 2) & 0xFFFFFF]
        # 101 and 102 are acknowledged by one or two ACKs (coalesced per receive batch),
        # the last for 102 with MSN 3; it may trail the results.
        while not acks or _aeth(acks[-1])[0] != 102:
            acks += recv_all(1)
        assert _aeth(acks[-1]) == (102, 0x1F, 3) and len(acks) <= 2
        # The worker's NIC NAKs first+1 (it lost it): the aggregator resends first+1 and
        # first+2 in order (first is implicitly acknowledged by the NAK).
        nak = bytearray(16)
        nak[0] = 0x11
        nak[2:4] = b"\xff\xff"
        nak[5:8] = ((index << 12) | 0).to_bytes(3, "big")
        nak[9:12] = ((first_psn + 1) & 0xFFFFFF).to_bytes(3, "big")
        nak[12] = 0x60
        nic.sendto(bytes(nak) + b"\0\0\0\0", (AGG, 4791))
        again = [int.from_bytes(p[9:12], "big") for p in recv_all(2)]
        assert again == [(first_psn + 1) & 0xFFFFFF, (first_psn + 2) & 0xFFFFFF]
        # Acknowledged: nothing more is resent, not even by the 200 ms timer.
        ack = bytearray(nak)
        ack[9:12] = ((first_psn + 2) & 0xFFFFFF).to_bytes(3, "big")
        ack[12] = 0x1F
        nic.sendto(bytes(ack) + b"\0\0\0\0", (AGG, 4791))
        nic.settimeout(0.5)
        with pytest.raises(socket.timeout):
            nic.recvfrom(4096)
    finally:
        nic.close()
