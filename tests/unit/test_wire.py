"""The RoCEv2 framing: field placement, validation, and the ICRC checked against an
independent implementation of the RoCEv2 rule written here from the spec."""
from __future__ import annotations

import random
import socket
import struct
import zlib

import pytest
from hypothesis import given, strategies as st

from netreduce import _native


def test_header_fields_sit_where_roce_puts_them():
    h = _native.encode_header({"dest_qp": 0x012345, "psn": 0xABCDEF, "dtype": 3, "op": 2,
                               "shadow": 1, "slot": 0x1234, "offset": 0x0102030405,
                               "key": 0xDEADBEEF, "length": 4094, "msg_id": 77})
    assert len(h) == _native.HEADER_BYTES == 32
    opcode, flags, pkey, qpn, psn = struct.unpack(">BBHII", h[:12])
    assert opcode == 0x2B  # UC RDMA WRITE Only with Immediate
    assert (flags >> 4) & 3 == 2  # PadCnt for 4094 bytes
    assert pkey == 0xFFFF and qpn & 0xFFFFFF == 0x012345 and psn & 0xFFFFFF == 0xABCDEF
    va, rkey, dmalen, imm = struct.unpack(">QIII", h[12:])
    assert va >> 60 == 3 and (va >> 58) & 3 == 2 and (va >> 57) & 1 == 1 and (va >> 56) & 1 == 0
    assert (va >> 40) & 0xFFFF == 0x1234 and va & (2**40 - 1) == 0x0102030405
    assert (rkey, dmalen, imm) == (0xDEADBEEF, 4094, 77)


@given(st.integers(0, 2**24 - 1), st.integers(0, 2**24 - 1), st.integers(0, 5),
       st.integers(0, 2), st.integers(0, 65535), st.integers(0, 2**40 - 1),
       st.integers(0, 2**32 - 1), st.integers(0, 4096), st.booleans())
def test_encode_decode_round_trip(qp, psn, dtype, op, slot, offset, key, length, result):
    fields = dict(dest_qp=qp, psn=psn, dtype=dtype, op=op, shadow=slot & 1, slot=slot,
                  offset=offset, key=key, length=length, msg_id=psn ^ 5, result=result)
    pad = (-length) % 4
    pkt = _native.encode_header(fields) + b"\1" * length + b"\0" * pad + b"\0" * 4
    back = _native.decode_header(pkt)
    for k, v in fields.items():
        assert back[k] == v, k


@pytest.mark.parametrize("mutate, why", [
    (lambda p: p[:20], "truncated"),
    (lambda p: p[:-1], "length disagrees"),
    (lambda p: b"\x0a" + p[1:], "other opcode"),
])
def test_decode_rejects(mutate, why):
    pkt = _native.encode_header({"length": 8}) + b"\0" * 8 + b"\0" * 4
    _native.decode_header(pkt)
    with pytest.raises(ValueError):
        _native.decode_header(mutate(pkt))


def test_jumbo_flag_gates_payloads_above_4k():
    big = 8192
    plain = _native.encode_header({"length": big}) + b"\0" * big + b"\0" * 4
    with pytest.raises(ValueError):
        _native.decode_header(plain)
    jumbo = _native.encode_header({"length": big, "jumbo": 1}) + b"\0" * big + b"\0" * 4
    assert _native.decode_header(jumbo)["jumbo"]
    assert jumbo[8] & 0x40  # BTH byte 8, reserved bit: the documented extension flag


def test_repeat_seen_flag_rides_on_results_only():
    # BTH byte 8, reserved bit 0x20 (docs/protocol.md, "Repeat seen"): set on a result
    # it tells the rank its resend was needless; a contribution never carries it.
    res = _native.encode_header({"result": 1, "repeat_seen": 1, "length": 4})
    assert res[8] & 0x20 and not res[8] & 0x40
    assert _native.decode_header(res + b"\0" * 8)["repeat_seen"]
    assert not _native.decode_header(_native.encode_header({"result": 1, "length": 4}) +
                                     b"\0" * 8)["repeat_seen"]
    contribution = bytearray(_native.encode_header({"length": 4}))
    assert not contribution[8] & 0x20
    contribution[8] |= 0x20  # set by hand: ignored on a contribution
    assert not _native.decode_header(bytes(contribution) + b"\0" * 8)["repeat_seen"]


def reference_icrc(src, dst, sport, dport, header, payload, pad, ip_id=0):
    """RoCEv2 ICRC per the IBTA annex: CRC32 over 64 one-bits (masked LRH), the IPv4
    header with TOS, TTL and checksum masked to ones, the UDP header with its checksum
    masked, the BTH with its reserved byte masked, then the rest of the packet. The
    IPv4 ID is not masked: 0 for a plain send, k for segment k of a GSO send."""
    udp_len = 8 + len(header) + len(payload) + pad + 4
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0xFF, 20 + udp_len, ip_id, 0x4000, 0xFF, 17, 0xFFFF,
                     socket.inet_aton(src), socket.inet_aton(dst))
    udp = struct.pack(">HHHH", sport, dport, udp_len, 0xFFFF)
    bth = header[:4] + b"\xff" + header[5:12]
    data = b"\xff" * 8 + ip + udp + bth + header[12:] + payload + b"\0" * pad
    return zlib.crc32(data)


@given(st.binary(min_size=0, max_size=300), st.integers(1, 65535), st.integers(1, 65535))
def test_icrc_matches_independent_reference(payload, sport, dport):
    header = _native.encode_header({"length": len(payload), "dest_qp": 4097, "key": 99, "psn": 5})
    pad = (-len(payload)) % 4
    got = _native.compute_icrc(struct.unpack("<I", socket.inet_aton("10.0.0.1"))[0],
                               struct.unpack("<I", socket.inet_aton("10.0.0.9"))[0],
                               socket.htons(sport), socket.htons(dport), header, payload, pad)
    assert got == reference_icrc("10.0.0.1", "10.0.0.9", sport, dport, header, payload, pad)


def test_icrc_of_every_payload_length_matches_the_reference():
    # Every payload length up to past a jumbo RoCE MTU's and past 9000, from four
    # alignments of random bytes: the CRC-32 takes a different path by length (on a
    # CPU with VPCLMULQDQ and AVX2 but no AVX-512, a 256-bit fold from 256 bytes on,
    # 128 bytes a loop trip, and ISA-L for the tail; wire/roce.cc), so each loop count
    # and tail length is met, and a wrong fold constant shows at every length past it.
    rng = random.Random(33)
    data = bytes(rng.getrandbits(8) for _ in range(9100))
    be = lambda a: struct.unpack("<I", socket.inet_aton(a))[0]  # noqa: E731
    lengths = list(range(0, 4200)) + list(range(8800, 9000))
    for n in lengths:
        start = n % 4 * 7
        payload = data[start:start + n]
        header = _native.encode_header({"length": n, "dest_qp": 4097, "key": 99, "psn": n})
        pad = (-n) % 4
        got = _native.compute_icrc(be("10.0.0.1"), be("10.0.0.9"), socket.htons(4791),
                                   socket.htons(5000 + n % 7), header, payload, pad)
        assert got == reference_icrc("10.0.0.1", "10.0.0.9", 4791, 5000 + n % 7, header,
                                     payload, pad), n


@given(st.binary(min_size=0, max_size=9000), st.integers(1, 65535), st.booleans())
def test_fan_out_icrc_from_a_shared_payload_crc_is_the_icrc(payload, sport, v6):
    # The aggregator's unicast fan-out computes the payload's CRC once per result and
    # each rank's ICRC from it and that rank's headers (wire::ComputeIcrcWith).
    header = _native.encode_header({"length": len(payload), "dest_qp": 4099, "key": 3, "psn": 77})
    pad = (-len(payload)) % 4
    src, dst = ("fd00:9::1", "fd00:9::2") if v6 else ("10.0.0.1", "10.0.0.9")
    shared = _native.compute_icrc_for(src, dst, 4791, sport, header, payload, pad,
                                      shared_payload_crc=True)
    assert shared == _native.compute_icrc_for(src, dst, 4791, sport, header, payload, pad)
    if not v6:
        assert shared == reference_icrc(src, dst, 4791, sport, header, payload, pad)


@given(st.binary(min_size=0, max_size=1500), st.integers(0, 63))
def test_icrc_of_a_gso_segment_follows_its_ip_id(payload, ip_id):
    # Segment k of a UDP GSO send leaves with IPv4 ID k (the kernel numbers a DF
    # datagram's segments from 0); the sender fixes the ICRC it computed for ID 0 with
    # icrc_ip_id_delta, which must give what the IBTA rule gives for that ID.
    header = _native.encode_header({"length": len(payload), "dest_qp": 8193, "key": 7, "psn": 9})
    pad = (-len(payload)) % 4
    be = lambda a: struct.unpack("<I", socket.inet_aton(a))[0]  # noqa: E731
    icrc0 = _native.compute_icrc(be("10.1.0.1"), be("10.1.0.2"), socket.htons(4791),
                                 socket.htons(5000), header, payload, pad)
    datagram = len(header) + len(payload) + pad + 4
    fixed = icrc0 ^ _native.icrc_ip_id_delta(datagram, ip_id)
    assert fixed == reference_icrc("10.1.0.1", "10.1.0.2", 4791, 5000, header, payload, pad, ip_id)


def test_build_info_names_features():
    info = _native.build_info()
    assert set(info["dtypes"]) == {"float32", "float64", "float16", "bfloat16", "int32", "int64"}
    assert info["simd"] in ("avx2+f16c", "generic") and "udp" in info["transports"]


def test_native_type_stub_matches_the_module():
    # netreduce/_native.pyi is the typed surface of the pybind11 module: every public
    # name and method of one must be in the other, or the stub has gone stale.
    import ast
    import pathlib

    stub = ast.parse((pathlib.Path(_native.__file__).parent / "_native.pyi").read_text())
    declared = {}
    for node in stub.body:
        if isinstance(node, ast.ClassDef):
            declared[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)
                                   and not n.name.startswith("_")}
        elif isinstance(node, ast.FunctionDef):
            declared[node.name] = None
        elif isinstance(node, ast.AnnAssign):
            declared[node.target.id] = None
    public = {n for n in dir(_native) if not n.startswith("_")}
    if not _native.HAVE_VERBS:  # built without libibverbs' headers
        declared = {k: v for k, v in declared.items() if k not in ("probe_verbs", "VerbsTransport")}
    if not _native.HAVE_XDP:  # built without libxdp's and libbpf's headers
        declared = {k: v for k, v in declared.items() if k != "XdpPorts"}
    assert set(declared) == public
    for name, methods in declared.items():
        if methods:
            assert methods == {m for m in vars(getattr(_native, name)) if not m.startswith("_")}, name
