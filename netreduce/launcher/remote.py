"""The keeper of a host's ranks: netreduce-run opens one ssh connection per remote
host and sends this file's source over its stdin; the remote Python runs it
(host_connection.py, LOADER), so the remote host needs no netreduce installed for it,
and nothing of a rank's environment — the job secret above all — appears on any
command line (ssh's, the remote shell's or Python's): it all follows on stdin.

On stdin, in order (one line each):
    <n>\\n<n bytes: this source>                          read by LOADER
    {"rank": 2, "argv": [...], "env": {...}, "cwd": "...", "grace_s": 3.0,
     "label": "rank 2 on h1"}                              one per rank, started at once
    "signal R N"   signal N to rank R's process group
    "stop R"       stop rank R: SIGTERM, then SIGKILL after its grace_s
    "end"          no more ranks: exit once every rank started has exited
and EOF — netreduce-run stopped the host's ranks, died, or the connection broke —
stops every rank (SIGTERM, SIGKILL after grace_s) and exits.

On stdout, MARKER first (what the remote login printed before it is not a frame),
then frames, each a header line "R K N" and, for output, N bytes:
    "R o N" / "R e N" + N bytes   rank R's stdout / stderr; N = 0: that stream ended
    "R x C"                       rank R exited with code C (128+S for signal S), sent
                                  after its output (bounded wait) so it reads last
The keeper's own stderr stays raw: ssh's and the login's messages share it.

Each rank runs in its own session (a signal reaches whatever it started), with
PR_SET_PDEATHSIG to the keeper; once it exits, what it left in its group is killed.
One keeper forks every rank of its host, as Open MPI's orted does: one ssh login and
one Python start per host instead of per rank.

Standard library only, and nothing runs at import: tests import it as a module."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Dict, List, Set

MARKER = b"\0netreduce-keeper 2\n"
CHUNK = 65536  # bytes read from a rank's pipe per frame


def _prctl():
    try:
        import ctypes
        return ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None


def _killpg(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class Keeper:
    """The ranks of one host, started from the thread that reads the control lines
    (it lives as long as the keeper: PR_SET_PDEATHSIG fires when the forking *thread*
    exits)."""

    def __init__(self, out_fd: int = 1) -> None:
        self.out_fd = out_fd
        self.write_lock = threading.Lock()
        self.lock = threading.Lock()
        self.procs: Dict[int, subprocess.Popen] = {}
        self.grace: Dict[int, float] = {}
        self.done: Dict[int, int] = {}   # rank -> exit code, once reported
        self.ended = False
        self.put: Set[str] = set()  # names put into the C environment for the last rank
        # Looked up before any fork: the child must not dlopen (another thread may
        # hold the loader's lock at fork time).
        prctl = _prctl()
        self.preexec = (lambda: prctl(1, signal.SIGKILL)) if prctl is not None else None

    # -- frames ----------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        with self.write_lock:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.out_fd, view):]
            except OSError:  # the connection is gone; EOF on stdin follows
                pass

    def frame(self, rank: int, kind: bytes, n: int, payload: bytes = b"") -> None:
        self.write(b"%d %s %d\n" % (rank, kind, n) + payload)

    def _pump(self, rank: int, kind: bytes, stream: IO[bytes]) -> None:
        fd = stream.fileno()
        try:
            while True:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                self.frame(rank, kind, len(chunk), chunk)
        except OSError:
            pass
        finally:
            self.frame(rank, kind, 0)
            stream.close()

    # -- ranks -----------------------------------------------------------------------
    def start(self, spec: dict) -> None:
        rank = int(spec["rank"])
        argv: List[str] = spec["argv"]
        # The job's environment over the remote login's own (HOME, USER, ...): put into
        # this process's C environment, which the rank inherits (ranks are forked one
        # at a time, on this thread); what the previous rank had and this one lacks goes.
        env: Dict[str, str] = spec["env"]
        for name in self.put - env.keys():
            os.unsetenv(name)
        for name, value in env.items():
            os.putenv(name, value)
        self.put = set(env)
        label = spec.get("label", f"rank {rank}")
        cwd = spec.get("cwd")
        if cwd and not os.path.isdir(cwd):
            cwd = None  # as horovodrun's `cd DIR > /dev/null 2>&1;`: the login directory
        self.grace[rank] = float(spec.get("grace_s", 3.0))
        try:
            proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, preexec_fn=self.preexec)
        except OSError as exc:
            message = f"netreduce-run: cannot start {label}: {argv[0]}: {exc.strerror}\n".encode()
            self.frame(rank, b"e", len(message), message)
            self.frame(rank, b"e", 0)
            self.frame(rank, b"o", 0)
            self._exited(rank, 127 if isinstance(exc, FileNotFoundError) else 126)
            return
        with self.lock:
            self.procs[rank] = proc
        pumps = [threading.Thread(target=self._pump, args=(rank, kind, stream), daemon=True)
                 for kind, stream in ((b"o", proc.stdout), (b"e", proc.stderr))]
        for t in pumps:
            t.start()
        threading.Thread(target=self._watch, args=(rank, proc, pumps), daemon=True).start()

    def _watch(self, rank: int, proc: subprocess.Popen, pumps: List[threading.Thread]) -> None:
        code = proc.wait()
        _killpg(proc.pid, signal.SIGKILL)  # what the rank left behind in its group
        deadline = time.monotonic() + 1.0  # a stray outside the group may hold a pipe
        for t in pumps:
            t.join(max(0.0, deadline - time.monotonic()))
        self._exited(rank, code if code >= 0 else 128 - code)

    def _exited(self, rank: int, code: int) -> None:
        self.frame(rank, b"x", code)
        with self.lock:
            self.done[rank] = code
        self._exit_if_done()

    def _exit_if_done(self) -> None:
        with self.lock:
            finished = self.ended and all(r in self.done for r in self.procs)
            codes = [self.done[r] for r in sorted(self.done)]
        if finished:
            sys.stderr.flush()
            # Not sys.exit: the main thread is blocked reading stdin, and the shutdown
            # of an interpreter whose daemon thread holds stdin's lock can abort.
            os._exit(next((c for c in codes if c), 0))

    def signal(self, rank: int, signum: int) -> None:
        proc = self.procs.get(rank)
        if proc is not None:
            _killpg(proc.pid, signum)

    def stop(self, ranks: List[int]) -> None:
        """SIGTERM to each rank's group, SIGKILL to those left after their grace."""
        procs = [(self.procs[r], self.grace.get(r, 3.0)) for r in ranks if r in self.procs]
        for proc, _ in procs:
            _killpg(proc.pid, signal.SIGTERM)
        start = time.monotonic()
        for proc, grace in procs:
            while proc.poll() is None and time.monotonic() < start + grace:
                time.sleep(0.02)
            _killpg(proc.pid, signal.SIGKILL)

    def serve(self, stream: IO[bytes]) -> None:
        """Read control lines until EOF, then stop every rank; returns once all have
        been reported (or exits the process earlier, after "end")."""
        self.write(MARKER)
        for line in iter(stream.readline, b""):
            if line.startswith(b"{"):
                self.start(json.loads(line))
                continue
            words = line.split()
            if len(words) == 3 and words[0] == b"signal":
                self.signal(int(words[1]), int(words[2]))
            elif len(words) == 2 and words[0] == b"stop":
                rank = int(words[1])
                threading.Thread(target=self.stop, args=([rank],), daemon=True).start()
            elif words == [b"end"]:
                with self.lock:
                    self.ended = True
                self._exit_if_done()
        # EOF: whoever started us is gone or wants every rank stopped.
        with self.lock:
            self.ended = True
            running = [r for r in self.procs if r not in self.done]
        self.stop(running)
        self._exit_if_done()
        deadline = time.monotonic() + 2.0  # the watchers report, then one of them exits
        while time.monotonic() < deadline:
            time.sleep(0.05)
            self._exit_if_done()


if __name__ == "__main__":
    Keeper().serve(sys.stdin.buffer)
    os._exit(255)  # a watcher did not report within 2 s of the last SIGKILL
