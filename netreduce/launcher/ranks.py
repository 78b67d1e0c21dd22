"""netreduce-run's ranks: N processes of one command on this host, each in its own
session (so that stopping a rank also stops whatever it started) and with
PR_SET_PDEATHSIG (so even a SIGKILL of the launcher takes the ranks with it), their
output prefixed with [rank], and stopped together: SIGTERM, then SIGKILL for
whatever is left after a grace period."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, List, Sequence

from netreduce.errors import NetReduceError
from netreduce.process import detach_and_die_with_parent

GRACE_S = 3.0  # SIGTERM -> SIGKILL; keeps "a failing rank stops the job" under 10 s


def _pump(stream: IO[bytes], out: IO[bytes], prefix: bytes, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        with lock:
            out.write(prefix + line)
            out.flush()
    stream.close()


class LaunchError(NetReduceError):
    """A rank could not be started; ``code`` is the exit status netreduce-run returns."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Job:
    def __init__(self, command: Sequence[str], np_: int, env: dict, prefix: bool) -> None:
        self.procs: List[subprocess.Popen] = []
        self.pumps: List[threading.Thread] = []
        lock = threading.Lock()
        for rank in range(np_):
            # torch.distributed's variables too, so init_process_group("netreduce" or
            # "gloo") works unchanged under netreduce-run.
            rank_env = dict(env, NETREDUCE_RANK=str(rank), NETREDUCE_LOCAL_RANK=str(rank),
                            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(np_),
                            LOCAL_WORLD_SIZE=str(np_))
            try:
                proc = subprocess.Popen(list(command), env=rank_env, preexec_fn=detach_and_die_with_parent,
                                        stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE if prefix else None,
                                        stderr=subprocess.PIPE if prefix else None)
            except OSError as exc:
                self.stop(signal.SIGKILL)
                raise LaunchError(f"cannot start rank {rank}: {command[0]}: {exc.strerror}",
                                  127 if isinstance(exc, FileNotFoundError) else 126) from None
            self.procs.append(proc)
        # Readers start only after the last fork: preexec_fn in a process that already
        # runs threads can deadlock on a lock a thread held at fork time.
        for rank, proc in enumerate(self.procs if prefix else []):
            for stream, out in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
                t = threading.Thread(target=_pump, daemon=True,
                                     args=(stream, out, f"[{rank}] ".encode(), lock))
                t.start()
                self.pumps.append(t)

    def signal_all(self, signum: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signum)  # the rank and anything it started
                except ProcessLookupError:
                    pass

    def stop(self, first: int = signal.SIGTERM) -> None:
        """first signal, then SIGKILL for whatever is left after the grace period;
        the process groups are killed even when the leader already exited."""
        self.signal_all(first)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.02)
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()

    def finish_output(self) -> None:
        for t in self.pumps:
            t.join(2.0)
