"""The control protocol's codec: request and reply lines to and from the types of
netreduce/protocol/messages.py (the schema), and the refusal a line that is not what it
says gets (ProtocolError, naming the command and the field).

A request line is the request's fields with its ``cmd`` tag; a reply line is
``{"ok":true, "id":ID?, ...the reply's fields}`` or ``{"ok":false, "id":ID?,
"error":TEXT}``, read in two steps: the envelope (ok, id, error), then the reply
type the request named. The typed decoders are made on first use (_decoder).
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Optional, Type

import msgspec
from msgspec import Struct

from netreduce.errors import InvalidArgumentError
from netreduce.protocol.messages import COMMANDS, AnyRequest, Reply, Request


class Envelope(Struct, forbid_unknown_fields=False):
    """What every reply carries around its fields (read before the typed reply)."""
    ok: bool = False
    id: Optional[int] = None
    error: str = ""


class Head(Struct, forbid_unknown_fields=False):
    """A request line's command and id, read loosely: to name them in a refusal
    when the line does not decode as the request it says it is."""
    cmd: Any = None
    id: Any = None


class ProtocolError(InvalidArgumentError):
    """A line that is not what the protocol says (malformed, unknown command, a field
    of the wrong type or out of range): its message names the command and field."""

    def __init__(self, message: str, rid: Optional[int] = None) -> None:
        super().__init__(message)
        self.rid = rid


_encoder = msgspec.json.Encoder()
_envelope_decoder = msgspec.json.Decoder(Envelope)
_head_decoder = msgspec.json.Decoder(Head)
_any_decoder = msgspec.json.Decoder()


@functools.lru_cache(maxsize=None)
def _decoder(kind: Any) -> Any:
    """The typed decoder of ``kind``, made on first use: a decoder reads its types'
    annotations when it is made, and only an aggregator decodes requests, a client the
    replies of the few commands it sends (all of them made at import were ~7 ms of
    every daemon's and rank's start, at the suite's 1,000+ starts)."""
    return msgspec.json.Decoder(kind)


def encode_request(request: Request) -> bytes:
    """One request line."""
    return _encoder.encode(request) + b"\n"


def decode_request(line: bytes) -> Request:
    """The request a line holds; ProtocolError naming the command and the field."""
    try:
        return _decoder(AnyRequest).decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise _refusal(line, exc) from None


def _refusal(line: bytes, exc: Exception) -> ProtocolError:
    try:
        head = _head_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return ProtocolError(f"malformed request {line[:200]!r}: not a JSON object ({exc})")
    rid = head.id if isinstance(head.id, int) and not isinstance(head.id, bool) else None
    cmd = head.cmd
    if not isinstance(cmd, str):
        return ProtocolError(f"malformed request: 'cmd' must name a command, got {cmd!r}", rid)
    if cmd not in COMMANDS:
        return ProtocolError(f"unknown command {cmd[:100]!r}", rid)
    return ProtocolError(f"malformed '{cmd}' request: {exc}", rid)


def encode_reply(reply: Optional[Reply], rid: Optional[int] = None) -> bytes:
    """``{"ok":true,"id":ID,...}`` + newline: the reply's own fields after the envelope."""
    body = _encoder.encode(reply) if reply is not None else b"{}"
    head = b'{"ok":true' if rid is None else b'{"ok":true,"id":%d' % rid
    return head + (b"," + body[1:] if len(body) > 2 else b"}") + b"\n"


def encode_error(message: str, rid: Optional[int] = None) -> bytes:
    out: Dict[str, Any] = {"ok": False, "error": message}
    if rid is not None:
        out["id"] = rid
    return _encoder.encode(out) + b"\n"


def decode_envelope(line: bytes) -> Envelope:
    """ok, id and error of a reply line (msgspec.DecodeError/ValidationError if the
    line is no reply at all)."""
    return _envelope_decoder.decode(line)


def decode_reply(line: bytes, kind: Type[Reply]) -> Reply:
    return _decoder(kind).decode(line)


def decode_any(line: bytes) -> Any:
    """A line as plain JSON values (the by-name client API of tests and tools)."""
    return _any_decoder.decode(line)


def to_builtins(obj: Any) -> Any:
    return msgspec.to_builtins(obj)


def build(cmd: str, **fields: Any) -> Request:
    """The request ``cmd`` with ``fields``, validated as the aggregator will: for
    callers that speak by name (tests, tools)."""
    if cmd not in COMMANDS:
        raise ProtocolError(f"unknown command {cmd!r}")
    try:
        return msgspec.convert(fields, COMMANDS[cmd][0])
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"malformed '{cmd}' request: {exc}") from None
