"""TLS on the control port (docs/operations.md, Security).

The aggregator daemon serves its control port over TLS when started with
``--tls-cert`` and ``--tls-key``; a rank then connects with TLS to the aggregators
it was given (NETREDUCE_SWITCH, NETREDUCE_STANDBY_SWITCH, NETREDUCE_RACK_SWITCH)
when NETREDUCE_TLS_CA names the CA that signed their certificates, checking the
certificate against the address it dialled (or NETREDUCE_TLS_SERVER_NAME). Other
control connections a rank makes (rank 0's rendezvous and in-process aggregator,
which have no certificate) stay plain TCP. TLS protects the control connections
only: the job's secret never travels on them anyway (protocol/auth.py), so TLS adds
confidentiality of what is negotiated and authenticates the aggregator to the
ranks; data packets stay RoCEv2 over UDP (keyed, not encrypted)."""
from __future__ import annotations

import functools
import socket
import ssl
from typing import Optional, Set, Tuple

from netreduce import config
from netreduce.errors import ControlPlaneError
from netreduce.protocol.address import format_address, parse_addresses


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """The daemon's context: its certificate chain and key (PEM files), TLS 1.2+."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


@functools.lru_cache(maxsize=8)
def _client_context(ca: str) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ControlPlaneError(f"NETREDUCE_TLS_CA={ca}: cannot load the CA certificate: "
                                f"{exc}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _aggregators() -> Set[Tuple[str, int]]:
    """Every aggregator address this rank was given, as (host, port)."""
    out: Set[Tuple[str, int]] = set()
    for knob in ("NETREDUCE_SWITCH", "NETREDUCE_STANDBY_SWITCH", "NETREDUCE_RACK_SWITCH"):
        text = config.get(knob)
        if text:
            out.update((h, int(p)) for h, p in parse_addresses(text, what=knob))
    return out


def context_for(address: Tuple[str, int]) -> Optional[ssl.SSLContext]:
    """The TLS context for a control connection to ``address``: set when
    NETREDUCE_TLS_CA is and ``address`` is one of the aggregators this rank was
    given (by name or by the address it resolves to); None = plain TCP."""
    ca = config.get("NETREDUCE_TLS_CA")
    if not ca:
        return None
    host, port = address[0], int(address[1])
    given = _aggregators()
    if (host, port) in given:
        return _client_context(ca)
    for h, p in given:
        if p == port and _resolves_to(h, host):
            return _client_context(ca)
    return None


def _resolves_to(name: str, address: str) -> bool:
    try:
        return address in {ai[4][0] for ai in socket.getaddrinfo(name, None)}
    except OSError:
        return False


def connect(address: Tuple[str, int], timeout: Optional[float]) -> socket.socket:
    """A connected socket to the control port at ``address``: TLS (handshake done,
    certificate checked) when context_for() says so. Errors are ControlPlaneError
    naming the aggregator and, for TLS, what did not verify."""
    where = format_address(address)
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except OSError as exc:
        raise ControlPlaneError(f"cannot reach aggregator control port {where}: {exc}; is "
                                "netreduce-switch running there (NETREDUCE_SWITCH)?") from None
    ctx = context_for(address)
    if ctx is None:
        return sock
    name = config.get("NETREDUCE_TLS_SERVER_NAME") or address[0]
    try:
        return ctx.wrap_socket(sock, server_hostname=name)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise ControlPlaneError(
            f"aggregator {where}: its TLS certificate is not trusted for '{name}' by "
            f"NETREDUCE_TLS_CA={config.get('NETREDUCE_TLS_CA')} "
            f"({exc.verify_message or exc.reason})") from None
    except (ssl.SSLError, OSError) as exc:
        sock.close()
        raise ControlPlaneError(f"aggregator {where}: TLS handshake failed ({exc}); does it "
                                "serve its control port with --tls-cert?") from None
