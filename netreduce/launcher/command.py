"""netreduce-run: start N ranks on this host, with an aggregator unless one is given.

    netreduce-run -np 4 python train.py
    netreduce-run -np 4 --switch 10.0.0.5:4791 -- python train.py --lr 0.1

Across hosts use the launcher you already have (mpirun, srun, torchrun) with
NETREDUCE_SWITCH=host:port; netreduce reads their rank variables (netreduce/environment.py).

Guarantees, because a training job that half-dies is worse than one that dies:
every rank runs in its own session (process group), so that stopping a rank also
stops whatever it started; each child also gets PR_SET_PDEATHSIG, so even a SIGKILL
of the launcher takes the ranks with it. When a rank exits non-zero, the others get
SIGTERM, then SIGKILL after a grace period, and netreduce-run exits with that rank's
code. SIGINT/SIGTERM sent to netreduce-run are forwarded the same way.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import time
from typing import List, Optional, Sequence

from netreduce import config
from netreduce.launcher.ranks import Job, LaunchError
from netreduce.process import free_tcp_port
from netreduce.protocol import auth, tls
from netreduce.protocol.address import format_address, parse_addresses
from netreduce.switch import spawn


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="netreduce-run",
        description="Run N netreduce ranks on this host. Starts a local aggregator "
                    "(netreduce-switch) unless --switch or NETREDUCE_SWITCH names one.",
        usage="netreduce-run -np N [--switch HOST:PORT] [--] COMMAND [ARGS...]")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True,
                   help="number of ranks to start on this host")
    p.add_argument("--switch", default=None,
                   help="aggregator control address HOST:PORT, or several comma-separated "
                        "(the job spreads over them; default: NETREDUCE_SWITCH, "
                        "else start one on 127.0.0.1)")
    p.add_argument("--job", default=None,
                   help="job name at the aggregator (default: unique per run)")
    p.add_argument("--switch-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the embedded netreduce-switch (repeatable), "
                        "e.g. --switch-arg=--threads=2")
    p.add_argument("--no-prefix", action="store_true",
                   help="do not prefix output lines with [rank]")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program every rank runs")
    return p


def _exit_code(returncode: int) -> int:
    return returncode if returncode > 0 else 128 - returncode


def run(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given")
    if args.np < 1:
        parser.error("-np must be at least 1")

    switch_proc = None
    address = args.switch or config.get("NETREDUCE_SWITCH")
    if address:
        try:
            address = ",".join(format_address(a) for a in parse_addresses(
                address, what="--switch" if args.switch else "NETREDUCE_SWITCH"))
        except ValueError as exc:
            parser.error(str(exc))
    else:
        extra = []
        for arg in args.switch_arg:
            extra += arg.split("=", 1) if arg.startswith("--") and "=" in arg else [arg]
        # All ranks share this host: one multicast result per slot beats N copies.
        # Its only jobs are this run's, which always have a secret.
        # NETREDUCE_TLS_CA without a certificate: this loopback aggregator stays plain
        # and the ranks are told so (below); with NETREDUCE_TLS_CERT it serves TLS.
        tls_args = tls.job_server_args() if tls.job_server_files() else []
        switch_proc = spawn(host="127.0.0.1", port=0, fanout="multicast",
                            extra_args=["--require-secret"] + tls_args + extra)
        address = f"{switch_proc.address[0]}:{switch_proc.address[1]}"

    job_name = args.job or config.get("NETREDUCE_JOB") or \
        f"run-{os.getpid()}-{secrets.token_hex(4)}"
    # The job's secret (netreduce/protocol/auth.py): the user's, else a fresh one per run.
    job_secret = auth.job_secret() or secrets.token_hex(32)
    env = config.child_environment(NETREDUCE_SWITCH=address, NETREDUCE_JOB=job_name,
                                   NETREDUCE_SIZE=args.np, NETREDUCE_LOCAL_SIZE=args.np,
                                   NETREDUCE_JOB_SECRET=job_secret)
    if switch_proc is not None and not tls.job_server_files():
        env.pop("NETREDUCE_TLS_CA", None)  # nothing of this job leaves the host
    env["PYTHONUNBUFFERED"] = "1"  # ranks' lines reach the prefixer as they are printed
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(free_tcp_port()))

    received: List[int] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    job = None
    code = 0
    try:
        try:
            job = Job(command, args.np, env, not args.no_prefix)
        except LaunchError as exc:
            print(f"netreduce-run: {exc}", file=sys.stderr)
            return exc.code
        while True:
            if received:
                job.stop(received[0])
                code = 128 + received[0]
                break
            codes = [p.poll() for p in job.procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, rc = failed[0]
                print(f"netreduce-run: rank {rank} exited with code {rc}; stopping the other "
                      f"{sum(c is None for c in codes)} rank(s)", file=sys.stderr, flush=True)
                job.stop(signal.SIGTERM)
                code = _exit_code(rc)
                break
            if all(c == 0 for c in codes):
                job.stop(signal.SIGTERM)  # reap strays the ranks left in their groups
                break
            time.sleep(0.05)
    finally:
        if job is not None:
            if any(p.poll() is None for p in job.procs):
                job.stop(signal.SIGKILL)
            job.finish_output()
        if switch_proc is not None:
            switch_proc.stop()
        for s, handler in old.items():
            signal.signal(s, handler)
    return code


def main(argv: Optional[Sequence[str]] = None) -> None:
    sys.exit(run(argv))
