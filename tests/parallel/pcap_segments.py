"""Split the UDP GSO sends of a loopback capture into the datagrams they carry.

Loopback (like veth) passes a GSO send on whole: the capture holds one IP packet whose
UDP payload is several RoCEv2 datagrams back to back, all of the first one's length
but the last (native/transport/udp/gso_runs.h). The kernel cuts such a packet where a
device cannot segment it, giving segment k the IPv4 ID of the send plus k and its own
lengths and checksums; split_gso() does the same to a classic pcap (tshark -F pcap),
so that tshark decodes each datagram as the receiver gets it. A datagram's length is
read from its own RoCEv2 header: 32 bytes of BTH + RETH + ImmDt, the DMA length padded
to 4, the ICRC."""
from __future__ import annotations

import struct

ETH = 14


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _datagram_len(udp_payload: bytes) -> int:
    dmalen = struct.unpack(">I", udp_payload[24:28])[0]
    return 32 + ((dmalen + 3) & ~3) + 4


def _segments(frame: bytes, port: int):
    """The frames a GSO send of `frame` (Ethernet + IPv4/IPv6 + UDP to or from `port`)
    becomes, or None when it is a single datagram (or not ours)."""
    eth_type = struct.unpack(">H", frame[12:14])[0]
    if eth_type == 0x0800:
        ihl = (frame[ETH] & 0xF) * 4
        ip, l4 = frame[ETH:ETH + ihl], ETH + ihl
        if ip[9] != 17:
            return None
    elif eth_type == 0x86DD:
        ip, l4 = frame[ETH:ETH + 40], ETH + 40
        if ip[6] != 17:
            return None
    else:
        return None
    sport, dport = struct.unpack(">HH", frame[l4:l4 + 4])
    payload = frame[l4 + 8:]
    if port not in (sport, dport) or len(payload) < 36:
        return None
    seg = _datagram_len(payload)
    if seg >= len(payload):
        return None
    out = []
    for k, off in enumerate(range(0, len(payload), seg)):
        chunk = payload[off:off + seg]
        udp = struct.pack(">HHHH", sport, dport, 8 + len(chunk), 0) + chunk
        if eth_type == 0x0800:
            ident = (struct.unpack(">H", ip[4:6])[0] + k) & 0xFFFF
            hdr = bytearray(ip)
            struct.pack_into(">HH", hdr, 2, len(hdr) + len(udp), ident)
            struct.pack_into(">H", hdr, 10, 0)
            struct.pack_into(">H", hdr, 10, _checksum(bytes(hdr)))
        else:
            hdr = bytearray(ip)
            struct.pack_into(">H", hdr, 4, len(udp))
        out.append(frame[:ETH] + bytes(hdr) + udp)
    return out


def split_gso(src, dst, port: int) -> int:
    """Copy pcap `src` to `dst` with every GSO send to or from UDP `port` cut into
    its datagrams; returns how many sends were cut."""
    with open(src, "rb") as f:
        data = f.read()
    magic = struct.unpack("<I", data[:4])[0]
    if magic not in (0xA1B2C3D4, 0xA1B23C4D):
        raise ValueError(f"{src}: not a little-endian classic pcap (capture with -F pcap)")
    if struct.unpack("<I", data[20:24])[0] != 1:
        raise ValueError(f"{src}: link type is not Ethernet")
    out = [data[:24]]
    cut = 0
    at = 24
    while at + 16 <= len(data):
        sec, frac, incl, orig = struct.unpack("<IIII", data[at:at + 16])
        frame = data[at + 16:at + 16 + incl]
        at += 16 + incl
        parts = _segments(frame, port) if incl == orig else None
        if parts is None:
            out.append(struct.pack("<IIII", sec, frac, incl, orig) + frame)
            continue
        cut += 1
        for p in parts:
            out.append(struct.pack("<IIII", sec, frac, len(p), len(p)) + p)
    with open(dst, "wb") as f:
        f.write(b"".join(out))
    return cut
