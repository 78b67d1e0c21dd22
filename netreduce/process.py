"""Child-process plumbing shared by the launcher and the embedded aggregator."""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: the explicit stop on exit still applies


# Looked up once, here: a child forked while other threads run must not dlopen
# (a lock another thread held at fork time would stay held in the child).
_PRCTL = _prctl()


def detach_and_die_with_parent() -> None:
    """For ``preexec_fn``, in the child before exec: a new session (so signals to the
    parent's terminal group do not reach it twice), and SIGTERM when the parent dies,
    so that a killed launcher or rank 0 leaves no orphan behind. Linux sends it when
    the *thread* that forked exits: fork from a thread that lives as long as the child
    should (netreduce/launcher/spawn.py forks from one kept for that)."""
    os.setsid()
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def terminate(proc: "subprocess.Popen", timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
