"""Tests that speak the control port by hand: a ``register`` with the rank's data
address (docs/protocol.md, *Control: admission*), as dataplane.Connection sends it.
The aggregator takes a rank's contributions from that address only."""
from __future__ import annotations

import socket
from typing import Any, Dict, Optional

from netreduce.protocol.address import format_address


def jumbo_packet(fields: Dict[str, Any], payload: bytes) -> bytes:
    """A data packet as a rank sends it: ``fields`` encoded as the RoCE header with the
    jumbo bit (no ICRC checked: the trailer is 4 zero bytes), then ``payload``."""
    from netreduce import _native

    return _native.encode_header(dict(fields, jumbo=1)) + payload + b"\0" * 4


def data_socket(client: Any) -> socket.socket:
    """A UDP socket on the address ``client``'s control connection comes from: one a
    test may register as a rank's data address and send that rank's packets from."""
    host = client._sock.getsockname()[0]
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    return s


def address_of(sock: socket.socket) -> str:
    return format_address(sock.getsockname()[:2])


def register(client: Any, job: str, rank: int, size: int, sock: Optional[socket.socket] = None,
             **fields: Any) -> Dict[str, Any]:
    """``register`` on ``client`` with ``sock``'s address as the rank's data address;
    without ``sock``, a placeholder port on the control connection's address (a rank
    whose data the test never sends)."""
    if sock is not None:
        where = address_of(sock)
    else:
        where = format_address((client._sock.getsockname()[0], 9))  # discard: never sent from
    return client.call("register", job=job, rank=rank, size=size, data_address=where, **fields)
