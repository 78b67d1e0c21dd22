"""Start one rank's command on a host — a local process, or over ssh as horovodrun
does — and hold it: poll(), wait(), send_signal(), kill(), its output prefixed.

    out = Output(prefix=True, output_dir=None, size=4)
    r = start(["python", "train.py"], rank=2, host="h1", env=env, local=False,
              ssh=SshOptions(port=22), output=out)
    ...
    r.send_signal(signal.SIGTERM); r.wait(3.0); r.kill(); out.close()

A local rank is a child process in its own session (a signal to the rank reaches
whatever it started) with PR_SET_PDEATHSIG, so that even a SIGKILLed launcher takes
it along. A remote rank is `ssh HOST <loader>`, whose remote Python reads
netreduce/launcher/remote.py's source from ssh's stdin, then the rank's argv, working
directory and environment — the job secret with it — and keeps the rank: forwards
signals written on stdin, and stops it when stdin ends (the launcher stopped it, died,
or the connection broke). So nothing secret is on any command line, on either
machine, and nothing outlives the job on a remote host.

ssh runs as horovodrun runs it: `ssh -o PasswordAuthentication=no -o
StrictHostKeyChecking=no [-p PORT] [-i IDENTITY] HOST ...`, with the user's own ssh
configuration (~/.ssh/config) applying; its exit code 255 means ssh itself failed.

Every fork happens on one long-lived thread of this module: Linux sends the
PDEATHSIG when the *thread* that forked exits, and a launcher (the elastic driver) may
start ranks from short-lived threads."""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Callable, List, Mapping, Optional, Sequence

from netreduce.errors import NetReduceError
from netreduce.process import detach_and_die_with_parent

GRACE_S = 3.0  # SIGTERM -> SIGKILL; keeps "a failing rank stops the job" under 10 s
SSH_OPTIONS = ("-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no")
# Runs on the remote host under its login shell: reads the keeper's source (remote.py)
# from stdin and runs it. -S: the keeper needs only the standard library.
LOADER = "import sys;b=sys.stdin.buffer;exec(b.read(int(b.readline())))"
# Not sent to a remote rank (horovodrun's list, plus what describes the launching
# login rather than the job): the remote login sets its own.
_NOT_FORWARDED = re.compile(r"BASH_FUNC_.*|OLDPWD|PWD|HOSTNAME|HOME|USER|LOGNAME|MAIL|SHELL|"
                            r"SHLVL|_|SSH_.*|.*CUDA_VISIBLE_DEVICES")


class LaunchError(NetReduceError):
    """A rank could not be started; ``code`` is the exit status netreduce-run returns."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class SshOptions:
    port: Optional[int] = None              # -p/--ssh-port
    identity_file: Optional[str] = None     # -i/--ssh-identity-file
    connect_timeout_s: Optional[int] = None  # ssh's ConnectTimeout (--start-timeout)
    python: str = sys.executable            # the remote Python for the keeper (python3 if absent)


def ssh_argv(host: str, options: SshOptions, remote_command: str) -> List[str]:
    argv = ["ssh", *SSH_OPTIONS]
    if options.connect_timeout_s:
        argv += ["-o", f"ConnectTimeout={int(options.connect_timeout_s)}"]
    if options.port is not None:
        argv += ["-p", str(options.port)]
    if options.identity_file:
        argv += ["-i", options.identity_file]
    return argv + [host, remote_command]


def keeper_command(python: str) -> str:
    """The remote shell command that runs the keeper: the launcher's Python path where
    the remote host has it (horovodrun makes the same assumption), else python3."""
    return (f"p={shlex.quote(python)}; [ -x \"$p\" ] || p=python3; "
            f"exec \"$p\" -S -c {shlex.quote(LOADER)}")


def forwarded_environment(env: Mapping[str, str]) -> dict:
    return {k: v for k, v in env.items() if not _NOT_FORWARDED.fullmatch(k)}


_KEEPER_SOURCE: Optional[bytes] = None


def _keeper_source() -> bytes:
    global _KEEPER_SOURCE
    if _KEEPER_SOURCE is None:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "remote.py"), "rb") as f:
            _KEEPER_SOURCE = f.read()
    return _KEEPER_SOURCE


# -- one thread forks everything ----------------------------------------------------------

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


def _on_forker(fn: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    global _forker
    with _forker_lock:
        if _forker is None:
            _forker = threading.Thread(target=_fork_loop, name="netreduce-run forker", daemon=True)
            _forker.start()
    if threading.current_thread() is _forker:
        return fn()
    done, box = threading.Event(), []
    _fork_queue.put((fn, done, box))
    done.wait()
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


# -- output -------------------------------------------------------------------------------

class Output:
    """Where the ranks' lines go: this process's stdout/stderr, each line prefixed as
    horovodrun does ("[2]<stdout>:..."), optionally with a timestamp; and with
    ``output_dir`` also, unprefixed, to OUTPUT_DIR/rank.<rank>/stdout and stderr
    (horovodrun's --output-filename; ranks zero-padded so that they sort)."""

    def __init__(self, prefix: bool = True, output_dir: Optional[str] = None, size: int = 1,
                 timestamp: bool = False) -> None:
        self.prefix = prefix
        self.output_dir = output_dir
        self.width = len(str(max(size - 1, 0)))
        self.timestamp = timestamp
        self.lock = threading.Lock()
        self.threads: List[threading.Thread] = []
        if output_dir:
            os.makedirs(output_dir, exist_ok=True)

    @property
    def captures(self) -> bool:
        return self.prefix or bool(self.output_dir)

    def attach(self, rank: int, proc: subprocess.Popen) -> None:
        if not self.captures:
            return
        folder = None
        if self.output_dir:
            folder = os.path.join(self.output_dir, f"rank.{str(rank).zfill(self.width)}")
            os.makedirs(folder, exist_ok=True)
        for name, stream, out in (("stdout", proc.stdout, sys.stdout.buffer),
                                  ("stderr", proc.stderr, sys.stderr.buffer)):
            copy = open(os.path.join(folder, name), "wb") if folder else None
            t = threading.Thread(target=self._pump, daemon=True,
                                 args=(stream, out, f"[{rank}]<{name}>:".encode(), copy))
            t.start()
            self.threads.append(t)

    def _pump(self, stream: IO[bytes], out: IO[bytes], prefix: bytes,
              copy: Optional[IO[bytes]]) -> None:
        try:
            for line in iter(stream.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                if copy is not None:
                    copy.write(line)
                    copy.flush()
                head = b""
                if self.prefix:
                    head = (time.asctime().encode() if self.timestamp else b"") + prefix
                with self.lock:
                    out.write(head + line)
                    out.flush()
        finally:
            stream.close()
            if copy is not None:
                copy.close()

    def close(self, timeout_s: float = 2.0) -> None:
        """Wait (bounded) for the pumps to write what the ranks printed last."""
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


# -- one rank -----------------------------------------------------------------------------

def _killpg(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class RankProcess:
    """One started rank. ``proc`` is the rank itself (local) or its ssh client
    (remote); poll()/wait() give the rank's exit code either way (255 from ssh: ssh
    itself failed)."""

    def __init__(self, rank: int, host: str, remote: bool, proc: subprocess.Popen,
                 argv: Sequence[str]) -> None:
        self.rank = rank
        self.host = host
        self.remote = remote
        self.proc = proc
        self.argv = list(argv)  # what was exec'd here (the ssh command line for a remote rank)
        self._stdin_lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.returncode

    def poll(self) -> Optional[int]:
        return self.proc.poll()

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit code; subprocess.TimeoutExpired after ``timeout`` seconds."""
        return self.proc.wait(timeout)

    def _tell(self, line: Optional[bytes]) -> bool:
        """Write a control line to the remote keeper (None: close its stdin, which
        stops the rank). False when the connection is gone."""
        with self._stdin_lock:
            stdin = self.proc.stdin
            if stdin is None or stdin.closed:
                return False
            try:
                if line is None:
                    stdin.close()
                else:
                    stdin.write(line)
                    stdin.flush()
                return True
            except (BrokenPipeError, ValueError, OSError):
                return False

    def send_signal(self, signum: int) -> None:
        """``signum`` to the rank and everything it started (its process group)."""
        if not self.remote:
            _killpg(self.proc.pid, signum)  # also after the leader exited: its strays
        elif self.proc.poll() is None:
            self._tell(f"signal {int(signum)}\n".encode())

    def disconnect(self) -> None:
        """End a remote rank's connection: its keeper stops the rank (SIGTERM, then
        SIGKILL after GRACE_S). Nothing for a local rank."""
        if self.remote:
            self._tell(None)

    def kill(self, timeout_s: float = 2.0) -> None:
        """SIGKILL to the rank's process group; for a remote rank also the end of the
        connection, and the ssh client killed if it has not exited ``timeout_s`` later
        (an unreachable host). Returns once this side's process has exited."""
        if not self.remote:
            _killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return
        if self.proc.poll() is None:
            self._tell(f"signal {int(signal.SIGKILL)}\n".encode())
        self._tell(None)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _fork(argv: List[str], rank: int, host: str, **popen) -> subprocess.Popen:
    try:
        return _on_forker(lambda: subprocess.Popen(argv, preexec_fn=detach_and_die_with_parent,
                                                   **popen))
    except OSError as exc:
        raise LaunchError(f"cannot start rank {rank} on {host}: {argv[0]}: {exc.strerror}",
                          127 if isinstance(exc, FileNotFoundError) else 126) from None


def connect(rank: int, host: str, *, output: Output, ssh: SshOptions = SshOptions(),
            verbose: bool = False) -> RankProcess:
    """The first half of starting a remote rank: ssh to ``host`` and send the keeper,
    which then waits for the rank's description; launch() sends it. A launcher
    connects first and starts its aggregator meanwhile: the handshake, the remote
    login and the keeper's Python overlap with it."""
    pipe = subprocess.PIPE if output.captures else None
    argv = ssh_argv(host, ssh, keeper_command(ssh.python))
    if verbose:
        print(f"netreduce-run: rank {rank} on {host} over ssh: {shlex.join(argv)}",
              file=sys.stderr, flush=True)
    handle = RankProcess(rank, host, True, _fork(argv, rank, host, stdin=subprocess.PIPE,
                                                 stdout=pipe, stderr=pipe), argv)
    source = _keeper_source()
    # A few KiB: the pipe takes it without blocking, whatever ssh is doing.
    handle._tell(str(len(source)).encode() + b"\n" + source)
    output.attach(rank, handle.proc)
    return handle


def start(command: Sequence[str], rank: int, host: str, env: Mapping[str, str], *,
          local: bool, output: Output, ssh: SshOptions = SshOptions(),
          cwd: Optional[str] = None, verbose: bool = False,
          connected: Optional[RankProcess] = None) -> RankProcess:
    """Start rank ``rank`` of ``command`` on ``host`` with environment ``env`` (the
    rank's whole environment, its secret included) and return its handle; a remote
    rank ``connected`` beforehand (connect()) gets only its description.
    LaunchError (with netreduce-run's exit code) when it cannot be started here; a
    remote rank that cannot start shows as its exit code (127: no such program,
    255: ssh failed) and its stderr."""
    cwd = cwd or os.getcwd()
    if local:
        pipe = subprocess.PIPE if output.captures else None
        argv = list(command)
        if verbose:
            print(f"netreduce-run: rank {rank} on {host} locally: {shlex.join(argv)}",
                  file=sys.stderr, flush=True)
        proc = _fork(argv, rank, host, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                     stdout=pipe, stderr=pipe)
        output.attach(rank, proc)
        return RankProcess(rank, host, False, proc, argv)
    handle = connected or connect(rank, host, output=output, ssh=ssh, verbose=verbose)
    spec = {"argv": list(command), "env": forwarded_environment(env), "cwd": cwd,
            "grace_s": GRACE_S, "label": f"rank {rank} on {host}"}
    if not handle._tell(json.dumps(spec).encode() + b"\n") and verbose:
        print(f"netreduce-run: rank {rank} on {host}: ssh exited before it took the rank's "
              f"description", file=sys.stderr, flush=True)
    return handle


def ssh_hostname(host: str, options: SshOptions) -> Optional[str]:
    """The address or name ssh would connect to for ``host`` after its configuration
    (`ssh -G`: a Host alias's HostName), or None where ssh cannot say."""
    argv = ["ssh", "-G"] + (["-p", str(options.port)] if options.port is not None else []) + [host]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return None
