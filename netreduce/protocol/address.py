"""Aggregator addresses: the one parser of NETREDUCE_SWITCH, ``netreduce-run
--switch`` and the address the torch backend hands its ranks.

Accepted forms (the port defaults to 4791, RoCEv2's and netreduce-switch's):

    10.0.0.2:4791   10.0.0.2       IPv4 literal
    [fe80::1]:4791  [::1]   ::1    IPv6 literal (brackets needed with a port)
    agg-0:4791      agg-0.lan      host name, resolved when connecting

Several aggregators are a comma-separated list of these (``parse_addresses``).
Anything else is a ConfigError (a ValueError) that names the variable and the bad value."""
from __future__ import annotations

import ipaddress
import re
import socket
from typing import List, Tuple

from netreduce.errors import ConfigError

DEFAULT_PORT = 4791
Address = Tuple[str, int]

# Host names: dot-separated labels of letters, digits and inner hyphens (RFC 1123),
# underscores tolerated as container runtimes hand them out.
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?")


def _bad(what: str, text: str, why: str) -> ConfigError:
    return ConfigError(f"{what}={text!r} is not an aggregator address: {why} "
                      "(expected HOST, HOST:PORT, [IPv6] or [IPv6]:PORT; the port defaults to "
                      f"{DEFAULT_PORT})")


def _port(what: str, text: str, port: str) -> int:
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad(what, text, f"port {port!r} is not a number in 1..65535")
    return int(port)


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host.split("%", 1)[0])
        return True
    except ValueError:
        return False


def parse_address(text: str, default_port: int = DEFAULT_PORT,
                  what: str = "NETREDUCE_SWITCH") -> Address:
    """``text`` -> (host, port): host is an IP literal (IPv6 without brackets) or a
    host name, not yet resolved. ``what`` names the source in errors."""
    raw = text
    text = text.strip()
    if not text:
        raise _bad(what, raw, "it is empty")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not _is_ipv6(host):
            raise _bad(what, raw, "brackets must hold an IPv6 address")
        if rest == "":
            return host, default_port
        if not rest.startswith(":"):
            raise _bad(what, raw, f"unexpected {rest!r} after ']'")
        return host, _port(what, raw, rest[1:])
    if text.count(":") > 1:  # a bare IPv6 literal cannot carry a port
        if _is_ipv6(text):
            return text, default_port
        raise _bad(what, raw, "an IPv6 address with a port must be written [ADDRESS]:PORT")
    host, sep, port = text.partition(":")
    if not host:
        raise _bad(what, raw, "the host is missing")
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        if not _HOSTNAME.fullmatch(host) or host.replace(".", "").isdigit():
            raise _bad(what, raw, f"{host!r} is neither an IP address nor a host name") from None
    return host, (_port(what, raw, port) if sep else default_port)


def parse_addresses(text: str, default_port: int = DEFAULT_PORT,
                    what: str = "NETREDUCE_SWITCH") -> List[Address]:
    """A comma-separated list of aggregators (several aggregators: the job's chunks
    are spread over them, netreduce/algorithms/multi_aggregator.py) -> [(host, port)].
    One address is a list of one. Empty items and repeats are errors naming them."""
    items = [t.strip() for t in text.split(",")]
    if len(items) > 1 and any(not t for t in items):
        raise _bad(what, text, "the list has an empty item (a stray comma?)")
    out = [parse_address(t, default_port, what) for t in items]
    seen = set()
    for t, a in zip(items, out):
        if a in seen:
            raise _bad(what, text, f"{t!r} is listed twice")
        seen.add(a)
    return out


def format_address(address: Address) -> str:
    """(host, port) -> text that parse_address reads back ('[::1]:4791')."""
    host, port = address[0], int(address[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def unmap(host: str) -> str:
    """An IPv4-mapped IPv6 address ('::ffff:10.0.0.1', how a dual-stack socket names
    IPv4 peers) as the IPv4 address it is; anything else unchanged."""
    if ":" in host:
        try:
            mapped = ipaddress.IPv6Address(host).ipv4_mapped
        except ValueError:
            return host
        if mapped is not None:
            return str(mapped)
    return host


def resolve(address: Address) -> Address:
    """(host, port) with a host name replaced by its address (an IPv4 or IPv6
    literal; a name with both kinds of address takes its IPv4 one, as the native
    ResolveHost does); ConfigError (a ValueError) naming the host otherwise."""
    host, port = address
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise ConfigError(f"aggregator host {host!r} does not resolve: {exc.strerror}") from None
    v4 = [i for i in infos if i[0] == socket.AF_INET]
    return unmap(str((v4 or infos)[0][4][0]).split("%", 1)[0]), int(port)


def family_of(host: str) -> socket.AddressFamily:
    """The socket family that binds ``host``: AF_INET6 for an IPv6 address ('::'
    listens on both families), AF_INET for IPv4; a name, as it resolves."""
    if ":" not in host:
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            host = resolve((host, 0))[0]
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def connect_address(listen: Address) -> Address:
    """Where to reach a daemon listening on ``listen`` from this host: the wildcard
    ('0.0.0.0', '::') is reached on loopback ('127.0.0.1', '::1')."""
    host, port = listen
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host), int(port)
