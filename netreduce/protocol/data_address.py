"""A rank's data address: where its data packets come from, said at admission.

A rank binds the UDP socket its engine will send from before it registers, and says
that socket's address in ``register`` (``data_address``, docs/protocol.md, *Control:
admission*). The aggregator takes the rank's contributions from that address only and
so sends its results nowhere else: a stranger who replays the job's packets from its
own socket gets nothing back (docs/operations.md, *Security*). The address's IP must
be the one the rank's control connection comes from, whose TCP handshake proved that
the rank receives there; the port is the rank's word, given on the connection that
proved the job's secret. A rank whose data goes through a rack aggregator says so
(``rack``): the spine cannot check that address and hands it to the rack."""
from __future__ import annotations

import ipaddress
import socket
from typing import Tuple

from netreduce.errors import InvalidArgumentError
from netreduce.protocol.address import format_address, parse_address, unmap


def open_socket(host: str, port: int) -> socket.socket:
    """A UDP socket bound to the local address this host's routes use toward
    (``host``, ``port``) (an IP literal), on a port the kernel picks: the engine's
    data socket, handed to it later (``Engine(data_fd=...)``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_DGRAM)
    try:
        probe.connect((host, port))  # no packet: only the route's source address
        local = probe.getsockname()
    finally:
        probe.close()
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.bind((local[0], 0) + tuple(local[2:]))  # IPv6: flow info, scope
    except OSError:
        sock.close()
        raise
    return sock


def address_of(sock: socket.socket) -> str:
    """The socket's address as ``register`` says it: '10.0.0.5:40001', '[fd00::5]:40001'."""
    host, port = sock.getsockname()[:2]
    return format_address((host.split("%", 1)[0], port))


def parse(text: object, where: str) -> Tuple[str, int]:
    """A ``data_address`` -> (IP literal, port); InvalidArgumentError naming ``where``
    when it is none. (A verbs rank says its UDP socket's too, the one it falls back
    to; its queue pair's address then replaces it, any source port: its NIC picks.)"""
    if not isinstance(text, str) or not text:
        raise InvalidArgumentError(f"{where}: 'register' needs data_address, the IP:PORT its "
                                   "data packets come from (ranks of this version say it; "
                                   "update the rank)")
    try:
        host, port = parse_address(text, default_port=-1, what="data_address")
        ip = ipaddress.ip_address(unmap(host))
    except ValueError as exc:
        raise InvalidArgumentError(f"{where}: {exc}") from None
    if port == -1 or ip.is_unspecified or ip.is_multicast:
        raise InvalidArgumentError(f"{where}: data_address {text!r} is not an address a rank's "
                                   "packets can come from (IP:PORT of its data socket)")
    return str(ip), port


def same_host(a: str, b: str) -> bool:
    """Whether two IP literals are one address (IPv4-mapped IPv6 as IPv4)."""
    try:
        return ipaddress.ip_address(unmap(a)) == ipaddress.ip_address(unmap(b))
    except ValueError:
        return False
