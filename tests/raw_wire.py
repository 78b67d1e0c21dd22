"""Speaking the control port's wire by hand, for tests that send raw lines (hostile
input, memory, scale): one JSON object per line each way, and the version exchange
(netreduce/protocol/messages.py's ``hello``) first on every connection."""
from __future__ import annotations

import json
import socket
from typing import Any, Dict, Tuple

from netreduce.protocol import messages

HELLO = (json.dumps({"cmd": "hello", "version": messages.PROTOCOL_VERSION}) + "\n").encode()


def read_line(sock: socket.socket) -> Dict[str, Any]:
    """One reply (the caller sends one request at a time: no line is read past)."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        assert chunk, "the control port closed the connection"
        buf += chunk
    return json.loads(buf)


def greet(sock: socket.socket) -> socket.socket:
    """Say hello on a fresh connection; the aggregator must answer with its version."""
    sock.sendall(HELLO)
    reply = read_line(sock)
    assert reply["ok"] and reply["version"] == messages.PROTOCOL_VERSION, reply
    return sock


def connect(address: Tuple[str, int], timeout: float = 10.0) -> socket.socket:
    """A connection to the control port that has said hello."""
    return greet(socket.create_connection(address, timeout=timeout))


async def greet_async(reader: Any, writer: Any) -> None:
    """greet() on an asyncio stream pair."""
    writer.write(HELLO)
    reply = json.loads(await reader.readline())
    assert reply["ok"], reply
