"""TLS on the control port (docs/operations.md, Security).

The aggregator daemon serves its control port over TLS when started with
``--tls-cert`` and ``--tls-key``; a rank then connects with TLS to the aggregators
it was given (NETREDUCE_SWITCH, NETREDUCE_STANDBY_SWITCH, NETREDUCE_RACK_SWITCH)
when NETREDUCE_TLS_CA names the CA that signed their certificates, checking the
certificate against the address it dialled (or NETREDUCE_TLS_SERVER_NAME). A
daemon's own control connections to other aggregators (a spine's to its racks) and
`netreduce info --switch` do the same.

The job's own servers (rank 0's rendezvous, negotiation and status, the torch
backend's embedded aggregator, NETREDUCE_FALLBACK=host's per-rank aggregators) serve
TLS when the ranks are given NETREDUCE_TLS_CERT (and NETREDUCE_TLS_KEY): a
certificate signed by the same CA, for the name ranks dial (MASTER_ADDR, or
NETREDUCE_RENDEZVOUS's host); then every rank reaches them with TLS too, so with
both knobs set no control byte of the job crosses the network in clear. Without
NETREDUCE_TLS_CERT they stay plain TCP. TLS protects the control connections
only: the job's secret never travels on them anyway (protocol/auth.py), so TLS adds
confidentiality of what is negotiated and authenticates the aggregator to the
ranks; data packets stay RoCEv2 over UDP (keyed, not encrypted)."""
from __future__ import annotations

import functools
import logging
import socket
import ssl
import time
from typing import Dict, List, Optional, Set, Tuple

from netreduce import config
from netreduce.errors import ControlPlaneError
from netreduce.protocol.address import format_address, parse_addresses

log = logging.getLogger("netreduce")


# What a launcher that does not pass its environment on (Ray's actors) must hand to
# every rank itself: the files are paths, so they must exist on the ranks' hosts too.
KNOBS = ("NETREDUCE_TLS_CA", "NETREDUCE_TLS_SERVER_NAME", "NETREDUCE_TLS_CERT",
         "NETREDUCE_TLS_KEY")


def knobs() -> Dict[str, str]:
    """This process's TLS knobs that are set, for a launcher to pass to its ranks."""
    return {k: config.get(k) for k in KNOBS if config.get(k)}


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """The daemon's context: its certificate chain and key (PEM files), TLS 1.2+."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


def job_server_files() -> Optional[Tuple[str, str]]:
    """(certificate, key) the job's own servers serve TLS with (NETREDUCE_TLS_CERT,
    NETREDUCE_TLS_KEY, the key defaulting to the certificate's file); None = plain."""
    cert = config.get("NETREDUCE_TLS_CERT")
    return (cert, config.get("NETREDUCE_TLS_KEY") or cert) if cert else None


def job_server_args() -> List[str]:
    """netreduce-switch arguments for an aggregator a launcher or rank 0 starts for
    its job: TLS with NETREDUCE_TLS_CERT, so that ranks with NETREDUCE_TLS_CA can
    reach it. With the CA but no certificate the ranks could not: refused here,
    naming the knobs, rather than as a failed handshake on every rank."""
    files = job_server_files()
    if files is not None:
        return ["--tls-cert", files[0], "--tls-key", files[1]]
    if config.get("NETREDUCE_TLS_CA"):
        raise ControlPlaneError(
            "NETREDUCE_TLS_CA is set, so ranks reach their aggregator with TLS, but the one "
            "started for this job (no NETREDUCE_SWITCH) has no certificate: set "
            "NETREDUCE_TLS_CERT (and NETREDUCE_TLS_KEY) on every rank, or NETREDUCE_SWITCH")
    return []


def job_server_context() -> Optional[ssl.SSLContext]:
    """The context of a server this rank runs for its job (see job_server_files)."""
    files = job_server_files()
    if files is None:
        return None
    try:
        return server_context(*files)
    except (OSError, ssl.SSLError) as exc:
        raise ControlPlaneError(f"NETREDUCE_TLS_CERT={files[0]} / NETREDUCE_TLS_KEY={files[1]}: "
                                f"cannot load this rank's TLS certificate and key: {exc}") from None


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


def context_for(address: Tuple[str, int],
                aggregator: Optional[bool] = None) -> Optional[ssl.SSLContext]:
    """The TLS context for a control connection to ``address`` (None = plain TCP),
    when NETREDUCE_TLS_CA is set: always to an aggregator (``aggregator=True``, or
    None and ``address`` is one this rank was given, by name or by the address it
    resolves to); to the job's own servers when they serve TLS (NETREDUCE_TLS_CERT)."""
    ca = config.get("NETREDUCE_TLS_CA")
    if not ca:
        return None
    if aggregator or job_server_files() is not None:
        return _client_context(ca)
    if aggregator is False:
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


def connect(address: Tuple[str, int], timeout: Optional[float],
            aggregator: Optional[bool] = None, reach_for: float = 0.0) -> socket.socket:
    """A connected socket to the control port at ``address``: TLS (handshake done,
    certificate checked) when context_for() says so. Errors are ControlPlaneError
    naming the aggregator and, for TLS, what did not verify. ``reach_for`` > 0: a
    refused connection (nothing listens there yet) is tried again for that many
    seconds (a rank's first connection: netreduce-run starts the ranks beside their
    aggregator, not after it)."""
    where = format_address(address)
    try:
        sock = _dial(address, timeout, reach_for)
    except OSError as exc:
        waited = f", still after {reach_for:g} s of retries (NETREDUCE_START_TIMEOUT)" \
            if reach_for > 0 and isinstance(exc, ConnectionRefusedError) else ""
        raise ControlPlaneError(f"cannot reach aggregator control port {where}: {exc}{waited}; "
                                "is netreduce-switch running there (NETREDUCE_SWITCH)?") from None
    ctx = context_for(address, aggregator)
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


RETRY_NOTE_S = 5.0  # a rank still dialling after this long says so, once


def _dial(address: Tuple[str, int], timeout: Optional[float], reach_for: float) -> socket.socket:
    """socket.create_connection, asked again (10 ms, doubling to 100 ms apart) while the
    connection is refused, until ``reach_for`` seconds have passed."""
    deadline = time.monotonic() + reach_for
    noted, pause = False, 0.01
    while True:
        try:
            sock = socket.create_connection(address, timeout=timeout)
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise
        else:
            if sock.getsockname() != sock.getpeername():
                return sock
            # A dial of a free local port in the ephemeral range can come back connected
            # to itself (TCP simultaneous open): nobody listens there either. The next
            # try leaves from another port, so the deadline waits for a real refusal.
            sock.close()
        now = time.monotonic()
        if not noted and now >= deadline - reach_for + RETRY_NOTE_S:
            noted = True
            log.warning("netreduce: nothing listens on aggregator control port %s yet; "
                        "asking again until %g s have passed (NETREDUCE_START_TIMEOUT)",
                        format_address(address), reach_for)
        time.sleep(min(pause, max(0.0, deadline - now)))
        pause = min(2 * pause, 0.1)


def speaks_tls(address: Tuple[str, int], timeout: float = 2.0) -> bool:
    """Whether ``address`` completes a TLS handshake (certificate unchecked): why a
    plaintext connection to it was closed at once (protocol/client.py says so)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(address, timeout=timeout) as sock:
            with ctx.wrap_socket(sock, server_hostname=address[0]):
                return True
    except (OSError, ValueError):
        return False
