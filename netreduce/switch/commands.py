"""The control port's command table: which handler answers which request type.

Every command is declared once, in netreduce/protocol/messages.py (the schema both
the ranks and the aggregator use); this table binds each to the function that
serves it. The modules that add commands — the negotiation coordinator, two-level
trees, verbs peers, the job's rendezvous and status, the daemon's own ``fell_back``
— register into this table rather than into the server, so none of them imports
the server and the server imports none of them but verbs (a built-in of every
server). A handler gets the decoded, validated request (a messages.Request) and
returns its reply (the messages.Reply that messages.COMMANDS pairs with it), or a
Wait for one (netreduce/switch/waits.py)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Type, Union

from netreduce.errors import NetReduceError
from netreduce.protocol import messages

# handler(server, session, request) -> reply, or a Wait (netreduce/switch/waits.py)
Handler = Callable[[Any, Any, Any], Any]
DisconnectHook = Callable[[Any, Any], None]  # hook(server, session) when a connection closes
HANDLERS: Dict[Type[messages.Request], Handler] = {}
INLINE: set = set()  # request types whose handlers never block (they may return a Wait)
DISCONNECT_HOOKS: List[DisconnectHook] = []
# hook(server, job name, message) when a job's run cannot go on (a rank that
# registered with another world size): whatever waits for the job learns it at once.
JobFailureHook = Callable[[Any, str, str], None]
JOB_FAILURE_HOOKS: List[JobFailureHook] = []


class RequestError(NetReduceError):
    """Raised by a handler: answered as ok=false with this message."""


def register_handler(kind: Union[str, Type[messages.Request]], fn: Handler,
                     inline: bool = False) -> None:
    """Serve a command of the schema (its request type, or its name). ``inline``:
    the handler returns at once (a reply or a Wait) and runs on the event-loop
    thread; otherwise it may block, on the thread pool."""
    if isinstance(kind, str):
        kind = messages.COMMANDS[kind][0]
    HANDLERS[kind] = fn
    if inline:
        INLINE.add(kind)
    else:
        INLINE.discard(kind)


def register_disconnect_hook(fn: DisconnectHook) -> None:
    DISCONNECT_HOOKS.append(fn)


def register_job_failure_hook(fn: JobFailureHook) -> None:
    JOB_FAILURE_HOOKS.append(fn)
