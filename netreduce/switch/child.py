"""netreduce-switch started as a child process: the aggregator a single-process job,
netreduce-run or torchrun's rank 0 brings along (the embedded default), and tests.

``spawn`` runs ``python -m netreduce.switch`` and waits for the line the daemon
prints once it listens (READY_PREFIX, then the address), so the caller learns the
port a ``--port 0`` daemon picked; the child dies with its parent
(netreduce/process.py)."""
from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from typing import Any, List, Optional, Sequence, Tuple

from netreduce.errors import NetReduceError
from netreduce.process import detach_and_die_with_parent, terminate
from netreduce.protocol import tls
from netreduce.protocol.address import DEFAULT_PORT  # noqa: F401  netreduce.switch's
from netreduce.protocol.address import connect_address, family_of, format_address, parse_address

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


class Starting:
    """A daemon started and not yet known to listen: netreduce-run starts the ranks
    while it comes up (a rank's first connection is tried again until it listens)."""

    def __init__(self, proc: subprocess.Popen, cmd: List[str], host: str, port: int) -> None:
        self.proc, self.cmd, self.host, self.port = proc, cmd, host, port

    def ready(self, timeout: float = 30.0) -> SwitchProcess:
        """Wait for the daemon's ready line; NetReduceError (the daemon killed) when it
        exits or stays silent for ``timeout`` seconds."""
        proc = self.proc
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
        self.stop()
        raise NetReduceError(f"netreduce-switch did not start on "
                             f"{format_address((self.host, self.port))} within {timeout} s "
                             f"(exit code {proc.returncode}); command: {' '.join(self.cmd)}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def start(host: str = "127.0.0.1", port: int = 0, extra_args: Sequence[str] = (),
          **opts: object) -> Starting:
    """Start netreduce-switch without waiting for it to listen (Starting.ready waits).
    ``opts`` become flags (payload_bytes=4096 -> --payload-bytes 4096)."""
    cmd: List[str] = [sys.executable, "-m", "netreduce.switch", "--host", host, "--port", str(port)]
    for k, v in opts.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    cmd += list(extra_args)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                            preexec_fn=detach_and_die_with_parent)
    return Starting(proc, cmd, host, port)


def spawn(host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0,
          extra_args: Sequence[str] = (), **opts: object) -> SwitchProcess:
    """Start netreduce-switch and wait until it listens. ``opts`` become flags
    (payload_bytes=4096 -> --payload-bytes 4096)."""
    return start(host, port, extra_args, **opts).ready(timeout)


def free_aggregator_port(host: str, udp_ports: int = 2, attempts: int = 20) -> int:
    """A port P of ``host`` whose TCP P (the control port) and UDP P..P+udp_ports-1 (the
    data threads' ports and the multicast group's) are free now: what netreduce-run
    hands its ranks before the daemon it starts there listens. Another process may still
    take one first; then the daemon exits and the launcher says so."""
    family = family_of(host)
    for _ in range(attempts):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        try:
            for p in range(port, min(port + udp_ports, 65536)):
                with socket.socket(family, socket.SOCK_DGRAM) as udp:
                    udp.bind((host, p))
            return port
        except OSError:
            continue
    raise NetReduceError(f"no port of {host} with TCP and {udp_ports} UDP ports free "
                         f"in {attempts} tries")


def spawn_for_job(host: str = "127.0.0.1", *, fanout: str = "unicast", secret: bool = True,
                  tls_args: Optional[Sequence[str]] = None, extra_args: Sequence[str] = (),
                  port: int = 0, wait: bool = True) -> Any:
    """The aggregator a job brings along when it names none (no NETREDUCE_SWITCH):
    netreduce-run's, RayExecutor's, the torch backend's rank 0's, a single process's.
    On a free port of ``host``; ``fanout`` as --fanout (multicast where every rank
    shares this host: one packet per result instead of N copies); admitting only ranks that
    prove the job's secret (protocol/auth.py, job_secret_or_new) unless ``secret`` is
    False (a single process's own, an open job on loopback); TLS as NETREDUCE_TLS_CERT
    says (protocol/tls.py, job_server_args) unless ``tls_args`` are given. With
    ``wait=False`` it returns the Starting daemon (on ``port``, which the caller picked:
    free_aggregator_port) and the caller waits for it later."""
    args = ["--require-secret"] if secret else []
    args += list(tls.job_server_args() if tls_args is None else tls_args)
    started = start(host=host, port=port, fanout=fanout, extra_args=args + list(extra_args))
    return started.ready() if wait else started
