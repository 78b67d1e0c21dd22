"""One ssh connection per remote host, carrying all of that host's ranks.

    conn = HostConnection("h1", [2, 3], output=out, ssh=SshOptions(port=22))
    # ... start the aggregator meanwhile: the handshake and the login overlap it
    r2 = conn.start(2, ["python", "train.py"], env2, cwd)   # -> RemoteRank
    r3 = conn.start(3, ["python", "train.py"], env3, cwd)   # the last one: "end" follows

The connection is `ssh HOST <loader>`; the remote Python reads the keeper's source
(remote.py) from ssh's stdin, then each rank's argv, working directory and
environment — the job secret with them — so nothing secret is on any command line,
on either machine. The keeper forks every rank of its host, as Open MPI's orted does,
so a host costs one ssh login and one Python start, not one per rank; it sends each
rank's output and exit code back as frames on ssh's stdout (remote.py), which a
thread here turns into each rank's prefixed lines (output.py) and its exit code.
Signals and stops travel to the keeper as lines on ssh's stdin; when that ends
(netreduce-run stopped, died, or the connection broke) the keeper stops every rank,
so nothing outlives the job on a remote host.

ssh runs as horovodrun runs it: `ssh -o PasswordAuthentication=no -o
StrictHostKeyChecking=no [-p PORT] [-i IDENTITY] HOST ...`, with the user's own ssh
configuration (~/.ssh/config) applying; a rank whose exit the keeper never reported
gets ssh's exit code (255: ssh itself failed; 127: no Python there)."""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from typing import IO, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from netreduce.launcher.forking import GRACE_S, fork
from netreduce.launcher.output import Output, RankStream
from netreduce.launcher.remote import MARKER

SSH_OPTIONS = ("-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no")
# Runs on the remote host under its login shell: reads the keeper's source (remote.py)
# from stdin and runs it. -S: the keeper needs only the standard library.
LOADER = "import sys;b=sys.stdin.buffer;exec(b.read(int(b.readline())))"
# Not sent to a remote rank (horovodrun's list, plus what describes the launching
# login rather than the job): the remote login sets its own.
_NOT_FORWARDED = re.compile(r"BASH_FUNC_.*|OLDPWD|PWD|HOSTNAME|HOME|USER|LOGNAME|MAIL|SHELL|"
                            r"SHLVL|_|SSH_.*|.*CUDA_VISIBLE_DEVICES")
CUT_WAIT_S = 5.0  # after SIGKILL to ssh, for its pipes to close
F_SETPIPE_SZ = 1031  # Linux's fcntl
STDIN_PIPE_BYTES = 1 << 20  # within /proc/sys/fs/pipe-max-size's default


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


class HostConnection:
    """The ssh connection to ``host`` and its keeper, for ranks ``ranks`` (each started
    with start(), in any order; once the last is, the keeper is told there are no
    more). LaunchError when ssh itself cannot be started here."""

    def __init__(self, host: str, ranks: Sequence[int], *, output: Output,
                 ssh: SshOptions = SshOptions(), verbose: bool = False) -> None:
        self.host = host
        self.expected = list(ranks)
        self.argv = ssh_argv(host, ssh, keeper_command(ssh.python))
        what = (f"rank {self.expected[0]}" if len(self.expected) == 1 else
                f"ranks {','.join(map(str, self.expected))}") + f" on {host}"
        if verbose:
            print(f"netreduce-run: {what} over ssh: {shlex.join(self.argv)}",
                  file=sys.stderr, flush=True)
        self.proc = fork(self.argv, what, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
        self.cond = threading.Condition()
        self.codes: Dict[int, int] = {}  # rank -> exit code, once known
        self.sent: Set[int] = set()
        self.disconnected: Set[int] = set()
        self._stdin_lock = threading.Lock()
        self.streams: Dict[Tuple[int, bytes], RankStream] = {
            (r, kind): output.stream(r, name) for r in self.expected
            for kind, name in ((b"o", "stdout"), (b"e", "stderr"))}
        self.ranks = {r: RemoteRank(self, r) for r in self.expected}
        assert self.proc.stdin is not None
        try:  # the source and every rank's environment fit without waiting for ssh
            fcntl.fcntl(self.proc.stdin.fileno(), F_SETPIPE_SZ, STDIN_PIPE_BYTES)
        except OSError:
            pass  # 64 KiB: a host of many ranks may wait for its ssh to connect
        source = _keeper_source()
        self.tell(str(len(source)).encode() + b"\n" + source)
        self._stderr = threading.Thread(target=self._raw_stderr, daemon=True)
        self._stderr.start()
        reader = threading.Thread(target=self._read, daemon=True)
        reader.start()
        output.watch(reader)

    # -- to the keeper ---------------------------------------------------------------
    def tell(self, data: Optional[bytes]) -> bool:
        """Write to the keeper (None: close its stdin, which stops every rank). False
        when the connection is gone."""
        with self._stdin_lock:
            stdin = self.proc.stdin
            if stdin is None or stdin.closed:
                return False
            try:
                if data is None:
                    stdin.close()
                else:
                    stdin.write(data)
                    stdin.flush()
                return True
            except (BrokenPipeError, ValueError, OSError):
                return False

    def start(self, rank: int, argv: Sequence[str], env: Mapping[str, str], cwd: str,
              verbose: bool = False) -> "RemoteRank":
        """Send rank ``rank``'s description (``env`` its whole environment: what the
        remote login sets itself is left out); the keeper starts it at once."""
        spec = {"rank": rank, "argv": list(argv), "env": forwarded_environment(env),
                "cwd": cwd, "grace_s": GRACE_S, "label": f"rank {rank} on {self.host}"}
        line = json.dumps(spec).encode() + b"\n"
        with self.cond:
            self.sent.add(rank)
            if self.sent >= set(self.expected):
                line += b"end\n"
        if not self.tell(line) and verbose:
            print(f"netreduce-run: rank {rank} on {self.host}: ssh exited before it took the "
                  f"rank's description", file=sys.stderr, flush=True)
        return self.ranks[rank]

    def disconnect(self, rank: int) -> None:
        """Stop ``rank`` (SIGTERM, SIGKILL after GRACE_S); the last rank of the host
        disconnected closes the connection, which stops whatever is left."""
        with self.cond:
            self.disconnected.add(rank)
            last = self.disconnected >= set(self.expected)
        self.tell(None if last else f"stop {rank}\n".encode())

    def cut(self) -> None:
        """Kill the ssh client (an unreachable host); every rank not reported yet gets
        its exit code. Returns once the reader has seen it go (bounded)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        with self.cond:
            self.cond.wait_for(lambda: len(self.codes) == len(self.expected), CUT_WAIT_S)

    # -- from the keeper -------------------------------------------------------------
    def _raw_stderr(self) -> None:
        """ssh's, the login's and the keeper's own messages: the host's first rank's."""
        stream, stderr = self.streams[(self.expected[0], b"e")], self.proc.stderr
        assert stderr is not None
        for line in iter(stderr.readline, b""):
            stream.line(line)
        stderr.close()

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        first = self.streams[(self.expected[0], b"o")]
        try:
            while True:  # what the login printed before the keeper started
                line = stdout.readline()
                if not line:
                    return
                if line.endswith(MARKER):
                    if line != MARKER:
                        first.line(line[:-len(MARKER)])
                    break
                first.line(line)
            self._frames(stdout, first)
        finally:
            code = self.proc.wait()
            stdout.close()
            self._stderr.join(2.0)
            for stream in self.streams.values():
                stream.close()
            with self.cond:
                for r in self.expected:
                    self.codes.setdefault(r, code or 255)
                self.cond.notify_all()

    def _frames(self, stdout: IO[bytes], first: RankStream) -> None:
        while True:
            head = stdout.readline()
            if not head:
                return
            words = head.split(b" ")
            stream = None
            if len(words) == 3 and words[0].isdigit() and words[2].strip().isdigit():
                rank, kind, n = int(words[0]), words[1], int(words[2])
                stream = self.streams.get((rank, b"o" if kind == b"x" else kind))
            if stream is None:  # not the keeper's (nothing else should write here)
                first.line(head)
                continue
            if kind == b"x":
                with self.cond:
                    self.codes[rank] = n
                    self.cond.notify_all()
            elif n == 0:
                stream.close()
            else:
                stream.feed(stdout.read(n))

    def wait(self, rank: int, timeout: Optional[float]) -> int:
        with self.cond:
            if not self.cond.wait_for(lambda: rank in self.codes, timeout):
                raise subprocess.TimeoutExpired(self.argv, timeout or 0.0)
            return self.codes[rank]


class RemoteRank:
    """One rank on a remote host, held through its host's connection: the same
    interface as spawn.RankProcess (poll, wait, send_signal, disconnect, kill)."""

    remote = True

    def __init__(self, connection: HostConnection, rank: int) -> None:
        self.connection = connection
        self.rank = rank
        self.host = connection.host

    @property
    def proc(self) -> subprocess.Popen:
        """The host's ssh client."""
        return self.connection.proc

    @property
    def pid(self) -> int:
        return self.connection.proc.pid

    @property
    def argv(self) -> List[str]:
        return self.connection.argv

    @property
    def returncode(self) -> Optional[int]:
        return self.connection.codes.get(self.rank)

    def poll(self) -> Optional[int]:
        return self.connection.codes.get(self.rank)

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit code; subprocess.TimeoutExpired after ``timeout`` seconds."""
        return self.connection.wait(self.rank, timeout)

    def send_signal(self, signum: int) -> None:
        """``signum`` to the rank and everything it started (its process group)."""
        if self.poll() is None:
            self.connection.tell(f"signal {self.rank} {int(signum)}\n".encode())

    def disconnect(self) -> None:
        """The keeper stops the rank: SIGTERM, then SIGKILL after GRACE_S."""
        self.connection.disconnect(self.rank)

    def kill(self, timeout_s: float = 2.0) -> None:
        """SIGKILL to the rank's process group and its stop; if the keeper has not
        reported it ``timeout_s`` later (an unreachable host), the host's connection is
        cut, and the host's other ranks with it. Returns once its exit code is known."""
        self.send_signal(signal.SIGKILL)
        self.disconnect()
        try:
            self.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.connection.cut()
