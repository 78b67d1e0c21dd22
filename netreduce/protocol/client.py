"""Client side of the aggregator's control port: one JSON object per line each way."""
from __future__ import annotations

import json
import socket
import threading
from typing import Any, Dict, Optional

from netreduce.errors import ControlPlaneError
from netreduce.protocol import tls
from netreduce.protocol.address import Address, format_address, parse_address  # noqa: F401


class ControlClient:
    """A persistent connection to an aggregator's control port.

    Calls are serialised by a lock, so one client may be shared by threads. The
    connection stays open for the client's life: the aggregator takes its closing
    as the rank having left the job."""

    def __init__(self, address: Address, timeout: float = 30.0,
                 aggregator: Optional[bool] = None) -> None:
        self.address = (address[0], int(address[1]))
        self.timeout = timeout
        self._lock = threading.Lock()
        # TLS when NETREDUCE_TLS_CA is set (protocol/tls.py): to an aggregator, and to
        # the job's own servers when they serve it; ``aggregator`` as in tls.connect.
        self._sock = tls.connect(self.address, timeout, aggregator=aggregator)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self._sock.makefile("rb")

    def call(self, cmd: str, timeout: Optional[float] = None, **fields: Any) -> Dict[str, Any]:
        """Send one request and return the response fields; raise ControlPlaneError on
        ok=false, a closed connection or a timeout."""
        request = dict(fields, cmd=cmd)
        line = (json.dumps(request, separators=(",", ":")) + "\n").encode()
        where = format_address(self.address)
        with self._lock:
            try:
                self._sock.settimeout(self.timeout if timeout is None else timeout)
                self._sock.sendall(line)
                reply = self._file.readline()
            except OSError as exc:
                raise ControlPlaneError(f"aggregator {where}: '{cmd}' failed: {exc}") from None
        if not reply:
            raise ControlPlaneError(f"aggregator {where} closed the control connection during '{cmd}'")
        response = json.loads(reply)
        if not response.pop("ok", False):
            raise ControlPlaneError(f"aggregator {where}: {response.get('error', 'unknown error')}")
        return response

    def close(self) -> None:
        try:
            self._file.close()
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> "ControlClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
