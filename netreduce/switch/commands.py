"""The control port's command table: which handler answers which ``cmd``.

The server (netreduce/switch/server.py) answers its built-in commands itself and
looks every other one up here. The modules that add commands — the negotiation
coordinator, two-level trees, verbs peers, the job's rendezvous and status, the
daemon's own ``fell_back`` — register into this table rather than into the server,
so none of them imports the server and the server imports none of them but verbs
(a built-in of every server)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

from netreduce.errors import NetReduceError

# handler(server, session, request) -> reply dict, or a Wait (netreduce/switch/waits.py)
Handler = Callable[[Any, Any, Dict[str, Any]], Any]
DisconnectHook = Callable[[Any, Any], None]  # hook(server, session) when a connection closes
HANDLERS: Dict[str, Handler] = {}
INLINE: set = set()  # commands whose handlers never block (they may return a Wait)
DISCONNECT_HOOKS: List[DisconnectHook] = []


class RequestError(NetReduceError):
    """Raised by a handler: answered as ok=false with this message."""


def register_handler(cmd: str, fn: Handler, inline: bool = False) -> None:
    """Add a command. ``inline``: the handler returns at once (a reply or a Wait) and
    runs on the event-loop thread; otherwise it may block, on the thread pool."""
    HANDLERS[cmd] = fn
    if inline:
        INLINE.add(cmd)
    else:
        INLINE.discard(cmd)


def register_disconnect_hook(fn: DisconnectHook) -> None:
    DISCONNECT_HOOKS.append(fn)
