"""The RoCEv2 ICRC over IPv6: the native computation against a whole IPv6 RoCEv2
packet built by another implementation (scapy 2.8.0's scapy.contrib.roce, which
masks traffic class, flow label and hop limit as the IBTA RoCEv2 annex and Linux
rxe's rxe_icrc.c do), kept here as bytes so the check runs without scapy, and against
a reference that computes the ICRC from a packet's own bytes."""
from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, strategies as st

from netreduce import _native

# IPv6 (traffic class 0x2e, flow label 0x12345, hop limit 64) fd00:77::1 ->
# fd00:77::fe, UDP 50123 -> 4791, BTH + RETH + ImmDt as netreduce encodes them
# (dest QP 0x1005, PSN 0xABCDE, slot 3, offset 12, key 0xC0FFEE11, 10 bytes, msg 9),
# payload 01..0a, 2 pad bytes, ICRC: scapy built every byte, the ICRC included.
SCAPY_IPV6_PACKET = bytes.fromhex(
    "62e1234500381140fd000077000000000000000000000001fd0000770000000000000000000000fe"
    "c3cb12b700382ce3"
    "2b20ffff00001005000abcde000003000000000cc0ffee110000000a00000009"
    "0102030405060708090a0000"
    "e06a5c62")
# The same RoCEv2 packet over IPv4 (ID 0, DF, TOS 0x2e, TTL 64), 10.77.0.1 -> 10.77.0.254.
SCAPY_IPV4_PACKET = bytes.fromhex(
    "452e004c00004000401124db0a4d00010a4d00fe"
    "c3cb12b700387d46"
    "2b20ffff00001005000abcde000003000000000cc0ffee110000000a00000009"
    "0102030405060708090a0000"
    "1137c188")


def icrc_of_ipv6_packet(pkt: bytes) -> int:
    """The ICRC of a whole IPv6 RoCEv2 packet (no extension headers) from its own
    bytes: 8 bytes of ones, the IPv6 header with traffic class, flow label and hop
    limit set to ones, the UDP header with its checksum set to ones, the BTH with
    byte 4 (FECN, BECN, resv6) set to ones, then everything up to the ICRC."""
    ip = bytearray(pkt[:40])
    ip[0] |= 0x0F            # low nibble of byte 0: the traffic class's high bits
    ip[1:4] = b"\xff" * 3    # the rest of the traffic class, the flow label
    ip[7] = 0xFF             # hop limit
    udp = bytearray(pkt[40:48])
    udp[6:8] = b"\xff\xff"
    bth = bytearray(pkt[48:60])
    bth[4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth) + pkt[60:-4])


def _parts(pkt: bytes, ip_len: int):
    header = pkt[ip_len + 8:ip_len + 8 + 32]
    pad = (header[1] >> 4) & 3
    length = struct.unpack(">I", header[24:28])[0]
    payload = pkt[ip_len + 8 + 32:ip_len + 8 + 32 + length]
    sport, dport = struct.unpack(">HH", pkt[ip_len:ip_len + 4])
    return header, payload, pad, sport, dport


def test_icrc_of_a_scapy_built_ipv6_packet():
    pkt = SCAPY_IPV6_PACKET
    header, payload, pad, sport, dport = _parts(pkt, 40)
    assert (sport, dport) == (50123, 4791) and len(payload) == 10 and pad == 2
    got = _native.compute_icrc_for("fd00:77::1", "fd00:77::fe", sport, dport, header, payload, pad)
    assert struct.pack("<I", got) == pkt[-4:]  # stored little-endian, as rxe does
    assert got == icrc_of_ipv6_packet(pkt)
    # Same addresses in another spelling: the address, not its text, counts.
    assert got == _native.compute_icrc_for("fd00:77:0:0:0:0:0:1", "fd00:77::00fe", sport, dport,
                                           header, payload, pad)


def test_icrc_of_the_same_packet_over_ipv4():
    pkt = SCAPY_IPV4_PACKET
    header, payload, pad, sport, dport = _parts(pkt, 20)
    got = _native.compute_icrc_for("10.77.0.1", "10.77.0.254", sport, dport, header, payload, pad)
    assert struct.pack("<I", got) == pkt[-4:]
    # The IPv4-mapped spelling of an IPv4 address is an IPv4 packet (a dual-stack
    # socket names IPv4 peers so), and differs from the IPv6 packet's ICRC.
    assert got == _native.compute_icrc_for("::ffff:10.77.0.1", "::ffff:10.77.0.254", sport, dport,
                                           header, payload, pad)
    assert got != struct.unpack("<I", SCAPY_IPV6_PACKET[-4:])[0]


def test_masked_fields_do_not_change_the_icrc_but_addresses_do():
    pkt = bytearray(SCAPY_IPV6_PACKET)
    want = icrc_of_ipv6_packet(bytes(pkt))
    pkt[0] = 0x6A           # another traffic class
    pkt[1:4] = b"\x07\x00\x01"  # another flow label
    pkt[7] = 1              # another hop limit (a router decremented it)
    assert icrc_of_ipv6_packet(bytes(pkt)) == want
    header, payload, pad, sport, dport = _parts(SCAPY_IPV6_PACKET, 40)
    other = _native.compute_icrc_for("fd00:77::2", "fd00:77::fe", sport, dport, header, payload, pad)
    assert other != want


@given(st.binary(min_size=0, max_size=300), st.integers(1, 65535), st.integers(1, 65535),
       st.binary(min_size=16, max_size=16), st.binary(min_size=16, max_size=16))
def test_ipv6_icrc_matches_the_packet_reference(payload, sport, dport, src, dst):
    import ipaddress
    s, d = ipaddress.IPv6Address(src), ipaddress.IPv6Address(dst)
    if s.ipv4_mapped or d.ipv4_mapped:
        return  # those are IPv4 packets (tested above)
    header = _native.encode_header({"length": len(payload), "dest_qp": 4097, "key": 7, "psn": 5})
    pad = (-len(payload)) % 4
    udp_len = 8 + 32 + len(payload) + pad + 4
    pkt = (struct.pack(">IHBB", 0x6000_0000, udp_len, 17, 64) + src + dst +
           struct.pack(">HHHH", sport, dport, udp_len, 0) + header + payload + b"\0" * pad + b"\0" * 4)
    got = _native.compute_icrc_for(str(s), str(d), sport, dport, header, payload, pad)
    assert got == icrc_of_ipv6_packet(pkt)


def test_scapy_agrees_where_installed():
    scapy_all = pytest.importorskip("scapy.all", reason="scapy is not installed (optional check)")
    roce = pytest.importorskip("scapy.contrib.roce")
    header, payload, pad, sport, dport = _parts(SCAPY_IPV6_PACKET, 40)
    for size in (0, 1, 5, 64, 1001):
        body = bytes(range(256)) * 4
        pl = body[:size]
        hdr = _native.encode_header({"length": size, "dest_qp": 0x2003, "key": 1, "psn": size})
        p = (-size) % 4
        pkt = (scapy_all.IPv6(src="fd01::5", dst="fd01::9", tc=3, fl=77, hlim=9) /
               scapy_all.UDP(sport=40000, dport=4791) /
               roce.BTH(opcode=hdr[0], padcount=p, pkey=0xFFFF,
                        dqpn=int.from_bytes(hdr[5:8], "big"), psn=int.from_bytes(hdr[9:12], "big")) /
               (hdr[12:] + pl + b"\0" * p))
        wire = scapy_all.raw(pkt)
        got = _native.compute_icrc_for("fd01::5", "fd01::9", 40000, 4791, hdr, pl, p)
        assert struct.pack("<I", got) == wire[-4:], size
