"""Which jobs get multicast results under ``--fanout segment`` (the default).

A result sent to a job's IPv4 group (TTL 1) is replicated by the network, as a
switch's multicast engine would: one packet leaves the aggregator instead of one per
rank, the biggest saving a software aggregator has (BENCHMARKS.md, *Line rate per
core*). It reaches only the aggregator's own L2 segment, and a switch without IGMP
snooping floods it to every port of that segment. So a job gets its group only where
every rank is on that segment: each rank's address is one of this host's own, or on a
subnet of one of this host's interfaces that the route to it reaches without a
gateway. Any other job (a rank behind a router, an IPv6 rank) stays on unicast. The
group is then verified per rank as ``--fanout auto`` does it (docs/protocol.md,
*Multicast fan-out, auto*): a rank says in each contribution whether the group
reached it, and one that does not say so gets a unicast copy of every result, so a
group that fails to arrive costs no time.

Read from this process's network namespace (``/proc/net/route``), so a daemon in a
namespace judges by its own routes.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Iterable, List, Optional, Tuple

ROUTES = "/proc/net/route"

Route = Tuple[int, int, int, str]  # destination, mask, gateway (host order), device


def parse_routes(text: str) -> List[Route]:
    """IPv4 routes of a ``/proc/net/route`` text (hex fields in network order)."""
    out: List[Route] = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 8:
            continue
        try:
            dest, gw, mask = (_ip_of(x) for x in (f[1], f[2], f[7]))
            flags = int(f[3], 16)
        except ValueError:
            continue
        if flags & 0x1:  # RTF_UP
            out.append((dest, mask, gw, f[0]))
    return out


def _ip_of(field: str) -> int:
    """A /proc/net/route field (the address's bytes read as a little-endian word,
    printed in hex) as the address's integer."""
    return struct.unpack("!I", struct.pack("<I", int(field, 16)))[0]


def _is_local(address: str) -> bool:
    """One of this host's own addresses (loopback included): binding it works."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def why_not_on_segment(address: str, routes: List[Route]) -> Optional[str]:
    """None when ``address`` is this host or on a directly connected IPv4 subnet;
    otherwise why not."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"{address!r} is not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is None:
            return f"{address} is IPv6 (multicast results are IPv4 only)"
        ip = ip.ipv4_mapped
    if ip.is_loopback or _is_local(str(ip)):
        return None
    value = int(ip)
    best: Optional[Route] = None
    for r in routes:
        if value & r[1] == r[0] and (best is None or r[1] > best[1]):
            best = r
    if best is None:
        return f"no route to {ip}"
    if best[2] != 0:
        return f"{ip} is reached through gateway {ipaddress.IPv4Address(best[2])} ({best[3]})"
    return None


def job_on_segment(addresses: Iterable[str], routes_text: Optional[str] = None) -> Optional[str]:
    """None when every address is on this host's L2 segment (the job gets its group);
    otherwise the first reason it is not (the job stays on unicast)."""
    if routes_text is None:
        try:
            with open(ROUTES) as f:
                routes_text = f.read()
        except OSError as exc:
            return f"cannot read {ROUTES}: {exc.strerror}"
    routes = parse_routes(routes_text)
    for a in addresses:
        why = why_not_on_segment(a, routes)
        if why is not None:
            return why
    return None
