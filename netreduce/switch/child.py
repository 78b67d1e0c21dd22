"""netreduce-switch started as a child process: the aggregator a single-process job,
netreduce-run or torchrun's rank 0 brings along (the embedded default), and tests.

``spawn`` runs ``python -m netreduce.switch`` and waits for the line the daemon
prints once it listens (READY_PREFIX, then the address), so the caller learns the
port a ``--port 0`` daemon picked; the child dies with its parent
(netreduce/process.py)."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import List, Optional, Sequence, Tuple

from netreduce.errors import NetReduceError
from netreduce.process import detach_and_die_with_parent, terminate
from netreduce.protocol import tls
from netreduce.protocol.address import DEFAULT_PORT  # noqa: F401  netreduce.switch's
from netreduce.protocol.address import connect_address, format_address, parse_address

# The daemon's first lines on stdout (netreduce/switch/daemon.py prints them).
READY_PREFIX = "netreduce-switch listening on "
METRICS_PREFIX = "netreduce-switch metrics on "


class SwitchProcess:
    """A netreduce-switch daemon started as a child process (the embedded default)."""

    def __init__(self, proc: subprocess.Popen, address: Tuple[str, int], ready: str = "") -> None:
        self.proc = proc
        self.address = address
        self.ready = ready  # the daemon's "listening on" line (ports, fan-out, data path)

    def stop(self, timeout: float = 5.0) -> None:
        terminate(self.proc, timeout)
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> "SwitchProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn(host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0,
          extra_args: Sequence[str] = (), **opts: object) -> SwitchProcess:
    """Start netreduce-switch and wait until it listens. ``opts`` become flags
    (payload_bytes=4096 -> --payload-bytes 4096)."""
    cmd: List[str] = [sys.executable, "-m", "netreduce.switch", "--host", host, "--port", str(port)]
    for k, v in opts.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    cmd += list(extra_args)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                            preexec_fn=detach_and_die_with_parent)
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    # Read the pipe's bytes ourselves: the metrics line and the ready line may arrive
    # in one read, and a buffered readline() would keep the second where select()
    # cannot see it (then this waited out the whole timeout).
    fd, seen = proc.stdout.fileno(), b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        chunk = os.read(fd, 4096) if ready else b""
        seen += chunk
        *lines, seen = seen.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            if line.startswith(READY_PREFIX):
                listen = parse_address(line[len(READY_PREFIX):].split()[0], what="ready line")
                return SwitchProcess(proc, connect_address(listen), line.strip())
        if (ready and not chunk) or proc.poll() is not None:
            break  # end of its output: it exited
    proc.kill()
    proc.wait()
    raise NetReduceError(f"netreduce-switch did not start on {format_address((host, port))} "
                         f"within {timeout} s "
                         f"(exit code {proc.returncode}); command: {' '.join(cmd)}")


def spawn_for_job(host: str = "127.0.0.1", *, fanout: str = "unicast", secret: bool = True,
                  tls_args: Optional[Sequence[str]] = None,
                  extra_args: Sequence[str] = ()) -> SwitchProcess:
    """The aggregator a job brings along when it names none (no NETREDUCE_SWITCH):
    netreduce-run's, RayExecutor's, the torch backend's rank 0's, a single process's.
    On a free port of ``host``; ``fanout`` as --fanout (multicast where every rank
    shares this host: one packet per result instead of N copies); admitting only ranks that
    prove the job's secret (protocol/auth.py, job_secret_or_new) unless ``secret`` is
    False (a single process's own, an open job on loopback); TLS as NETREDUCE_TLS_CERT
    says (protocol/tls.py, job_server_args) unless ``tls_args`` are given."""
    args = ["--require-secret"] if secret else []
    args += list(tls.job_server_args() if tls_args is None else tls_args)
    return spawn(host=host, port=0, fanout=fanout, extra_args=args + list(extra_args))
