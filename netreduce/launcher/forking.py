"""Every process netreduce-run starts is forked on one long-lived thread of this
module: Linux sends PR_SET_PDEATHSIG when the *thread* that forked exits, and a
launcher (the elastic driver) may start ranks from short-lived threads."""
from __future__ import annotations

import queue
import subprocess
import threading
from typing import Callable, List, Optional

from netreduce.errors import NetReduceError
from netreduce.process import detach_and_die_with_parent

GRACE_S = 3.0  # SIGTERM -> SIGKILL; keeps "a failing rank stops the job" under 10 s


class LaunchError(NetReduceError):
    """A rank could not be started; ``code`` is the exit status netreduce-run returns."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


_fork_queue: "queue.Queue[tuple]" = queue.Queue()
_forker: Optional[threading.Thread] = None
_forker_lock = threading.Lock()


def _fork_loop() -> None:
    while True:
        fn, done, box = _fork_queue.get()
        try:
            box.append(("ok", fn()))
        except BaseException as exc:  # handed back to the caller's thread
            box.append(("error", exc))
        done.set()


def on_forker(fn: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    """``fn()`` run on the forking thread; its result or its exception here."""
    global _forker
    with _forker_lock:
        if _forker is None:
            _forker = threading.Thread(target=_fork_loop, name="netreduce-run forker", daemon=True)
            _forker.start()
    if threading.current_thread() is _forker:
        return fn()
    done = threading.Event()
    box: List[tuple] = []
    _fork_queue.put((fn, done, box))
    done.wait()
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def fork(argv: List[str], what: str, **popen) -> subprocess.Popen:
    """Popen(argv, **popen) in its own session, dying with netreduce-run; LaunchError
    (127: no such program, else 126) naming ``what`` ("rank 2 on h1") when it cannot."""
    try:
        return on_forker(lambda: subprocess.Popen(argv, preexec_fn=detach_and_die_with_parent,
                                                  **popen))
    except OSError as exc:
        raise LaunchError(f"cannot start {what}: {argv[0]}: {exc.strerror}",
                          127 if isinstance(exc, FileNotFoundError) else 126) from None
