"""How a request line becomes a reply on the control port: the version exchange
(``greet``), the command table (switch/commands.py) and the reply's line, with what
a refusal may say. The schema is netreduce/protocol/messages.py; the event loop and
the server's state are switch/loop.py and switch/server.py, which calls these."""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from netreduce._version import __version__
from netreduce.protocol import codec, messages
from netreduce.protocol.codec import ProtocolError
from netreduce.switch.commands import HANDLERS, RequestError, register_handler
from netreduce.switch.waits import resolve

log = logging.getLogger("netreduce.switch")
# What a handler raises on values it cannot use (an unknown dtype's KeyError, an
# overflow, the binding's TypeError): a refusal of the request, not the daemon's bug.
UNUSABLE = (KeyError, IndexError, TypeError, ValueError, ArithmeticError, RecursionError)


def greet(sess: Any, msg: messages.Request) -> "tuple[bytes, bool]":
    """A connection's first request: ``hello`` with the protocol this aggregator
    speaks. Anything else (a client of protocol 1, which had no hello) or another
    version is refused naming both, and the connection closes."""
    mine = messages.PROTOCOL_VERSION
    me = f"this aggregator (netreduce {__version__}) speaks control protocol {mine}"
    if not isinstance(msg, messages.Hello):
        log.warning("refused control connection from %s: it sent '%s' without a protocol "
                    "version (protocol 1, an older netreduce)", sess.peer, messages.command(msg))
        return codec.encode_error(
            f"{me}, but the client sent '{messages.command(msg)}' without saying its protocol "
            "version (protocol 1: a netreduce from before the versioned protocol); run the "
            "same netreduce version on the ranks and the aggregators", msg.id), False
    if msg.version != mine:
        theirs = f" ({msg.software})" if msg.software else ""
        log.warning("refused control connection from %s: protocol %d%s, this aggregator "
                    "speaks %d", sess.peer, msg.version, theirs, mine)
        return codec.encode_error(
            f"{me}, but the client{theirs} speaks control protocol {msg.version}; run the "
            "same netreduce version on the ranks and the aggregators", msg.id), False
    sess.version = msg.version
    return codec.encode_reply(messages.HelloReply(
        version=mine, software=f"netreduce-switch {__version__}"), msg.id), True


def dispatch(srv: Any, sess: Any, msg: messages.Request) -> Any:
    """A request's reply, or a Wait for one."""
    handler = HANDLERS.get(type(msg))
    if handler is None:
        raise RequestError(f"'{messages.command(msg)}' is not served by this aggregator")
    return handler(srv, sess, msg)


def reply_line(msg: messages.Request, result: Optional[messages.Reply],
                error: Optional[BaseException]) -> bytes:
    """The reply to ``msg`` as it goes on the wire. Refusals carry their own words;
    anything else that went wrong is logged here and answered without its text: the
    daemon never returns its internals (a binding's signature, a traceback) to a
    client. fuzz/control_fuzzer.py drives this."""
    if error is None:
        return codec.encode_reply(result, msg.id)
    if isinstance(error, (RequestError, ProtocolError)):
        return codec.encode_error(str(error), msg.id)
    cmd = messages.command(msg)
    if isinstance(error, UNUSABLE):
        # Values the schema let through but a handler (or the binding) could not use,
        # e.g. a dtype no tensor has: hostile or broken input, refused by its kind only
        # (the text may be the binding's) and logged quietly (a stranger could flood).
        log.debug("control request '%s' refused: %r", cmd, msg, exc_info=error)
        return codec.encode_error(f"malformed '{cmd}' request: the aggregator cannot use "
                                     f"its values ({type(error).__name__})", msg.id)
    log.error("control request '%s' failed: %r", cmd, msg, exc_info=error)
    return codec.encode_error(f"the aggregator could not serve '{cmd}': an internal error "
                                 "(logged by the aggregator)", msg.id)


def outcome(future: Any) -> "tuple[Optional[messages.Reply], Optional[BaseException]]":
    error = future.exception()
    return (None, error) if error is not None else (future.result(), None)


def answer(srv: Any, sess: Any, line: bytes) -> bytes:
    """One request line -> its reply line, waiting on this thread if the handler
    returns a Wait (the fuzzer and the unit tests drive this)."""
    try:
        msg = codec.decode_request(line)
    except ProtocolError as exc:
        return codec.encode_error(str(exc), exc.rid)
    if sess.version is None or isinstance(msg, messages.Hello):
        return greet(sess, msg)[0]
    try:
        return reply_line(msg, resolve(dispatch(srv, sess, msg)), None)
    except Exception as exc:
        return reply_line(msg, None, exc)


def _counters_reply(out: Dict[str, Any]) -> messages.CountersReply:
    return messages.CountersReply(global_=out["global"], jobs=out["jobs"],
                                  hidden_jobs=out["hidden_jobs"], fanout=out["fanout"],
                                  transport=out.get("transport"))


# The built-in commands, in the table every other command registers into.
for _kind, _method in ((messages.Challenge, lambda srv, sess, msg: srv.guard.challenge(sess)),
                       (messages.Register, lambda srv, sess, msg: srv.register(sess, msg)),
                       (messages.Payload, lambda srv, sess, msg: srv.wait_payload(sess, msg)),
                       (messages.Release, lambda srv, sess, msg: srv.release_request(sess)),
                       (messages.Counters, lambda srv, sess, msg: _counters_reply(
                           srv.counters(sess, msg))),
                       (messages.Ping, lambda srv, sess, msg: messages.Empty())):
    register_handler(_kind, _method, inline=True)
