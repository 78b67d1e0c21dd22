"""Start one rank's command on a host — a local process, or over ssh as horovodrun
does — and hold it: poll(), wait(), send_signal(), kill(), its output prefixed.

    out = Output(prefix=True, output_dir=None, size=4)
    r = start(["python", "train.py"], rank=2, host="h1", env=env, local=False,
              ssh=SshOptions(port=22), output=out)
    ...
    r.send_signal(signal.SIGTERM); r.wait(3.0); r.kill(); out.close()

A local rank is a child process in its own session (a signal to the rank reaches
whatever it started) with PR_SET_PDEATHSIG, so that even a SIGKILLed launcher takes
it along (forking.py: every fork on one long-lived thread). A remote rank runs under
a keeper on its host, reached over one ssh connection per host (host_connection.py,
remote.py): netreduce-run opens a host's connection for all its ranks first
(connect_host()) and starts each rank on it (start(..., connected=)); start() without
``connected`` opens a connection for that rank alone (the elastic driver's workers).
Nothing secret is on any command line, on either machine, and nothing outlives the
job on a remote host."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from typing import Mapping, Optional, Sequence, Union

from netreduce.launcher.forking import GRACE_S, LaunchError, fork
from netreduce.launcher.host_connection import (  # noqa: F401  (spawn's interface)
    LOADER, SSH_OPTIONS, HostConnection, RemoteRank, SshOptions, forwarded_environment,
    keeper_command, ssh_argv, ssh_hostname)
from netreduce.launcher.output import Output

DEFAULT_SSH = SshOptions()

__all__ = ["GRACE_S", "LaunchError", "Output", "SshOptions", "RankProcess", "RemoteRank",
           "HostConnection", "start", "connect", "connect_host", "ssh_hostname"]


# -- one rank -----------------------------------------------------------------------------

def _killpg(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class RankProcess:
    """One rank started on this machine; a remote rank's handle (RemoteRank) has the
    same interface."""

    remote = False

    def __init__(self, rank: int, host: str, proc: subprocess.Popen,
                 argv: Sequence[str]) -> None:
        self.rank = rank
        self.host = host
        self.proc = proc
        self.argv = list(argv)  # what was exec'd

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

    def send_signal(self, signum: int) -> None:
        """``signum`` to the rank and everything it started (its process group)."""
        _killpg(self.proc.pid, signum)  # also after the leader exited: its strays

    def disconnect(self) -> None:
        """Nothing for a local rank (a remote one's keeper stops it)."""

    def kill(self, timeout_s: float = 2.0) -> None:
        """SIGKILL to the rank's process group; returns once it has exited."""
        _killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


Rank = Union[RankProcess, RemoteRank]


def connect_host(host: str, ranks: Sequence[int], *, output: Output,
                 ssh: SshOptions = DEFAULT_SSH, verbose: bool = False) -> HostConnection:
    """The first half of starting a host's remote ranks: one ssh connection to
    ``host`` and its keeper, which then waits for the ranks' descriptions (start(...,
    connected=conn.ranks[r])). A launcher connects first and starts its aggregator
    meanwhile: the handshake, the remote login and the keeper's Python overlap it."""
    return HostConnection(host, ranks, output=output, ssh=ssh, verbose=verbose)


def connect(rank: int, host: str, *, output: Output, ssh: SshOptions = DEFAULT_SSH,
            verbose: bool = False) -> RemoteRank:
    """connect_host() for one rank: its handle, for start(..., connected=)."""
    return connect_host(host, [rank], output=output, ssh=ssh, verbose=verbose).ranks[rank]


def start(command: Sequence[str], rank: int, host: str, env: Mapping[str, str], *,
          local: bool, output: Output, ssh: SshOptions = DEFAULT_SSH,
          cwd: Optional[str] = None, verbose: bool = False,
          connected: Optional[RemoteRank] = None) -> Rank:
    """Start rank ``rank`` of ``command`` on ``host`` with environment ``env`` (the
    rank's whole environment, its secret included) and return its handle; a remote
    rank ``connected`` beforehand (connect_host()) gets only its description.
    LaunchError (with netreduce-run's exit code) when it cannot be started here; a
    remote rank that cannot start shows as its exit code (127: no such program,
    255: ssh failed) and its stderr."""
    cwd = cwd or os.getcwd()
    if not local:
        handle = connected or connect(rank, host, output=output, ssh=ssh, verbose=verbose)
        return handle.connection.start(rank, command, env, cwd, verbose=verbose)
    pipe = subprocess.PIPE if output.captures else None
    argv = list(command)
    if verbose:
        print(f"netreduce-run: rank {rank} on {host} locally: {shlex.join(argv)}",
              file=sys.stderr, flush=True)
    proc = fork(argv, f"rank {rank} on {host}", env=dict(env), cwd=cwd,
                stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe)
    output.attach(rank, proc)
    return RankProcess(rank, host, proc, argv)
