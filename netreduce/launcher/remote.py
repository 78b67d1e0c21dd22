"""The rank's keeper on a remote host: netreduce-run sends this file's source over
ssh's stdin and the remote Python runs it (spawn.py, LOADER), so the remote host
needs no netreduce installed for it, and nothing of the rank's environment — the
job secret above all — appears on any command line (ssh's, the remote shell's or
Python's): it all follows on stdin, after the source.

On stdin, in order:
    <n>\\n<n bytes: this source>            read by LOADER
    {"argv": [...], "env": {...}, "cwd": "...", "grace_s": 3.0, "label": "rank 2 on h1"}\\n
    "signal N\\n" lines, any number, until EOF

The keeper starts the rank in its own session (so that a signal reaches whatever
the rank started too), forwards each "signal N" to that process group, and on EOF —
netreduce-run stopped it, died, or the ssh connection broke — sends SIGTERM, then
SIGKILL after grace_s. When the rank exits the keeper kills what the rank left in its
group and exits with the rank's code (128+N for a signal), which ssh hands back.

Standard library only, and nothing runs at import: tests import it as a module."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Dict, List


def _die_with_keeper() -> None:
    """preexec_fn (the keeper has no other thread yet when it forks): SIGKILL to the
    rank if the keeper dies without stopping it."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _killpg(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _control(stream: IO[bytes], proc: "subprocess.Popen", grace_s: float) -> None:
    for line in iter(stream.readline, b""):
        words = line.split()
        if len(words) == 2 and words[0] == b"signal" and words[1].isdigit():
            _killpg(proc.pid, int(words[1]))
    # EOF: whoever started us is gone or wants the rank stopped.
    _killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    _killpg(proc.pid, signal.SIGKILL)


def keep(stream: IO[bytes]) -> int:
    """Read the rank's description from ``stream``, run it, return its exit code."""
    spec = json.loads(stream.readline())
    argv: List[str] = spec["argv"]
    # The job's environment over the remote login's own (HOME, USER, ...): put into
    # this process's C environment, which the rank inherits.
    env: Dict[str, str] = spec["env"]
    for name, value in env.items():
        os.putenv(name, value)
    label = spec.get("label", "rank")
    cwd = spec.get("cwd")
    if cwd and not os.path.isdir(cwd):
        cwd = None  # as horovodrun's `cd DIR > /dev/null 2>&1;`: the login directory
    try:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_keeper)
    except OSError as exc:
        print(f"netreduce-run: cannot start {label}: {argv[0]}: {exc.strerror}",
              file=sys.stderr, flush=True)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    threading.Thread(target=_control, args=(stream, proc, float(spec.get("grace_s", 3.0))),
                     daemon=True).start()
    code = proc.wait()
    _killpg(proc.pid, signal.SIGKILL)  # what the rank left behind in its group
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    _code = keep(sys.stdin.buffer)
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: the control thread is blocked reading stdin, and the shutdown of
    # an interpreter whose daemon thread holds stdin's lock can abort.
    os._exit(_code)
