"""Tests that speak the control port by hand: a ``register`` with the rank's data
address (docs/protocol.md, *Control: admission*), as dataplane.Connection sends it.
The aggregator takes a rank's contributions from that address only."""
from __future__ import annotations

import contextlib
import socket
from typing import Any, Dict, Iterator, List, Optional, Tuple

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


@contextlib.contextmanager
def two_ranks(address: Any, job: str, timeout: float = 10.0
              ) -> Iterator[Tuple[Any, List[socket.socket], Dict[str, Any]]]:
    """Ranks 0 and 1 of a 2-rank ``job`` registered by hand on the aggregator at
    ``address``, each with its own data socket (receives wait at most ``timeout`` s).
    Yields rank 0's control client (for its ``counters``), the two sockets and rank 0's
    grant; closes the sockets and the connections on exit."""
    from netreduce.protocol.client import ControlClient

    with ControlClient(address) as c0, ControlClient(address) as c1:
        socks = [data_socket(c0), data_socket(c1)]
        try:
            grant = register(c0, job, 0, 2, socks[0])
            register(c1, job, 1, 2, socks[1])
            for s in socks:
                s.settimeout(timeout)
            yield c0, socks, grant
        finally:
            for s in socks:
                s.close()
