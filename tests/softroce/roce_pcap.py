"""Reading a capture of RoCEv2 packets: every packet's ICRC recomputed from its real
IPv4 header (the NIC's IPv4 ID included, which the aggregator's UDP socket cannot
see), per-QP PSN sequences, and tshark's decode (Wireshark's InfiniBand dissector)."""
from __future__ import annotations

import struct
import subprocess
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List


@dataclass
class RocePacket:
    src: str
    dst: str
    opcode: int
    dest_qp: int
    psn: int
    icrc_ok: bool
    length: int


def _ip(b: bytes) -> str:
    return ".".join(str(x) for x in b)


def icrc_ok(ip: bytes, udp: bytes, bth_on: bytes) -> bool:
    """RoCEv2 ICRC (IBTA annex A17): CRC-32 over 8 x 0xFF, the IPv4 header with TOS, TTL
    and checksum set to ones, the UDP header with its checksum set to ones, the BTH with
    byte 4 set to ones, and the rest up to the ICRC (little-endian last 4 bytes)."""
    ip = bytearray(ip)
    ip[1] = 0xFF
    ip[8] = 0xFF
    ip[10:12] = b"\xff\xff"
    udp = bytearray(udp)
    udp[6:8] = b"\xff\xff"
    body = bytearray(bth_on[:-4])
    body[4] = 0xFF
    crc = zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(body))
    return crc == struct.unpack("<I", bth_on[-4:])[0]


def read(path: Path) -> List[RocePacket]:
    data = path.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    off, out = 24, []
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(endian + "IIII", data[off:off + 16])
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        if linktype == 1:  # Ethernet
            if len(frame) < 14 or frame[12:14] != b"\x08\x00":
                continue
            pkt = frame[14:]
        else:
            continue
        ihl = (pkt[0] & 0xF) * 4
        if pkt[9] != 17:
            continue
        total = struct.unpack(">H", pkt[2:4])[0]
        pkt = pkt[:total]
        ip, udp, rest = pkt[:ihl], pkt[ihl:ihl + 8], pkt[ihl + 8:]
        if struct.unpack(">H", udp[2:4])[0] != 4791 or len(rest) < 16:
            continue
        out.append(RocePacket(_ip(ip[12:16]), _ip(ip[16:20]), rest[0],
                              int.from_bytes(rest[5:8], "big"), int.from_bytes(rest[9:12], "big"),
                              icrc_ok(ip, udp, rest), len(rest)))
    return out


def psn_gaps(packets: List[RocePacket], src: str) -> Dict[int, int]:
    """Per destination QP of packets from `src`: how many times the PSN did not
    advance by exactly one (mod 2^24) from the previous packet."""
    last: Dict[int, int] = {}
    gaps: Dict[int, int] = defaultdict(int)
    for p in packets:
        if p.src != src:
            continue
        if p.dest_qp in last and p.psn != (last[p.dest_qp] + 1) & 0xFFFFFF:
            gaps[p.dest_qp] += 1
        gaps.setdefault(p.dest_qp, 0)
        last[p.dest_qp] = p.psn
    return dict(gaps)


def psn_skips(stream: List[RocePacket]) -> Dict[int, int]:
    """Per destination QP of one sender's packets: how often the PSN jumped forward by
    more than one (a packet missing on the wire). Repeats (retransmissions) are not
    skips."""
    last: Dict[int, int] = {}
    skips: Dict[int, int] = defaultdict(int)
    for p in stream:
        if p.dest_qp in last:
            d = (p.psn - last[p.dest_qp]) & 0xFFFFFF
            if 1 < d < 0x800000:
                skips[p.dest_qp] += 1
        skips.setdefault(p.dest_qp, 0)
        last[p.dest_qp] = p.psn
    return dict(skips)


def tshark_summary(path: Path) -> Dict[str, int]:
    """Counts of what tshark's dissector makes of the capture: RoCE frames by opcode
    name, and any frame it flags malformed or with an error-level expert note."""
    fields = subprocess.run(
        ["tshark", "-r", str(path), "-Y", "infiniband", "-T", "fields",
         "-e", "infiniband.bth.opcode", "-e", "infiniband.reth.dmalen", "-e", "infiniband.immdt"],
        capture_output=True, text=True, check=True).stdout.splitlines()
    bad = subprocess.run(
        ["tshark", "-r", str(path), "-Y", "_ws.malformed || _ws.expert.severity >= 8388608"],
        capture_output=True, text=True, check=True).stdout.splitlines()
    counts: Dict[str, int] = defaultdict(int)
    for line in fields:
        parts = line.split("\t")
        counts["opcode_" + parts[0]] += 1
        counts["with_reth"] += 1 if len(parts) > 1 and parts[1] else 0
        counts["with_immdt"] += 1 if len(parts) > 2 and parts[2] else 0
    counts["frames"] = len(fields)
    counts["malformed_or_error"] = len(bad)
    return dict(counts)
