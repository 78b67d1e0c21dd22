"""netreduce-run: start a job's ranks — on this host, or across hosts with
horovodrun's flags — with an aggregator unless one is given.

    netreduce-run -np 4 python train.py
    netreduce-run -np 8 -H node1:4,node2:4 python train.py
    netreduce-run -np 8 --hostfile hosts.txt -p 2222 -i ~/.ssh/id_ed25519 python train.py
    netreduce-run -np 4 --switch 10.0.0.5:4791 -- python train.py --lr 0.1

Ranks are placed host by host (launcher/hosts.py); host names that resolve to this
machine run as local processes, the others over one ssh connection per host
(launcher/spawn.py, host_connection.py); every rank
gets netreduce's, torch's and horovodrun's rank variables. Without --switch (or
NETREDUCE_SWITCH) netreduce-run starts an aggregator: on 127.0.0.1 when every host is
this machine, else on the address this machine reaches the remote hosts from (the
route's source address; all addresses when they differ), requiring the job's
secret, which reaches each rank on ssh's stdin, never on a command line. Any elastic
flag (--min-np, --max-np, --host-discovery-script, ...) hands the run to
netreduce.launcher.elastic. The job's life and death: launcher/job.py.
"""
from __future__ import annotations

import argparse
import importlib
import os
import secrets
import signal
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from netreduce import config
from netreduce._version import __version__
from netreduce.launcher import horovod_flags
from netreduce.launcher import hosts as hostlist
from netreduce.launcher import spawn
from netreduce.launcher.job import Job, stop
from netreduce.process import free_tcp_port
from netreduce.protocol import auth, tls
from netreduce.errors import NetReduceError
from netreduce.protocol.address import connect_address, format_address, parse_addresses
from netreduce.switch import spawn_for_job
from netreduce.switch.child import free_aggregator_port
from netreduce.switch.settings import DEFAULTS as SWITCH_DEFAULTS

DEFAULT_CONNECT_TIMEOUT_S = 30  # horovodrun's default --start-timeout
DAEMON_START_S = 30.0  # for the embedded aggregator's ready line (switch/child.py's wait)


def _elastic_module():
    """netreduce.launcher.elastic, or None until that package exists."""
    try:
        return importlib.import_module("netreduce.launcher.elastic")
    except ModuleNotFoundError as exc:
        if exc.name == "netreduce.launcher.elastic":
            return None
        raise


def build_parser() -> Tuple[argparse.ArgumentParser, List[str]]:
    """The parser, and the destinations of the elastic package's flags."""
    p = argparse.ArgumentParser(
        prog="netreduce-run",
        description="Run a netreduce job's ranks on this host or, with -H/--hostfile, across "
                    "hosts over ssh, with horovodrun's flags (docs/horovodrun.md). Starts an "
                    "aggregator (netreduce-switch) unless --switch or NETREDUCE_SWITCH names one.",
        usage="netreduce-run -np N [-H HOST:SLOTS,...|--hostfile FILE] [--switch HOST:PORT] "
              "[--] COMMAND [ARGS...]")
    p.add_argument("-v", "--version", action="version", version=f"netreduce-run {__version__}")
    p.add_argument("-np", "--num-proc", dest="np", type=int, default=None,
                   help="number of ranks (required)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", default=None, metavar="HOST:SLOTS,...",
                       help="hosts and their slots, e.g. node1:4,node2:4; ranks fill them host "
                            "by host; names that resolve to this machine (localhost, "
                            "127.0.0.1) run locally, yet count as distinct hosts "
                            "(default: localhost:NP)")
    where.add_argument("-hostfile", "--hostfile", default=None, metavar="FILE",
                       help="a file of 'HOST slots=N' lines, instead of -H")
    p.add_argument("-p", "--ssh-port", type=int, default=None, help="ssh port on every host")
    p.add_argument("-i", "--ssh-identity-file", default=None, metavar="FILE",
                   help="ssh's private key (ssh -i)")
    p.add_argument("--start-timeout", type=int, default=None, metavar="SECONDS",
                   help="seconds for ssh to connect and for init() to see every rank "
                        f"(ssh: {DEFAULT_CONNECT_TIMEOUT_S}; init: NETREDUCE_START_TIMEOUT)")
    p.add_argument("--output-filename", default=None, metavar="DIR",
                   help="also write each rank's output to DIR/rank.<rank>/stdout and stderr")
    p.add_argument("--verbose", action="store_true",
                   help="say where each rank runs, the aggregator each host dials, and the "
                        "commands started")
    p.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", action="store_true",
                   dest="prefix_timestamp", help="timestamp each prefixed output line")
    p.add_argument("--switch", default=None,
                   help="aggregator control address HOST:PORT, or several comma-separated "
                        "(the job spreads over them; default: NETREDUCE_SWITCH, "
                        "else start one)")
    p.add_argument("--job", default=None,
                   help="job name at the aggregator (default: unique per run)")
    p.add_argument("--switch-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the embedded netreduce-switch (repeatable), "
                        "e.g. --switch-arg=--threads=2")
    p.add_argument("--no-prefix", action="store_true",
                   help="do not prefix output lines with [rank]<stdout>:")
    horovod_flags.add_arguments(p)
    elastic = _elastic_module()
    before = {a.dest for a in p._actions}
    if elastic is not None:
        elastic.add_arguments(p)
    elastic_dests = [a.dest for a in p._actions if a.dest not in before]
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program every rank runs")
    return p, elastic_dests


def _elastic_requested(parser: argparse.ArgumentParser, args: argparse.Namespace,
                       dests: Sequence[str]) -> bool:
    return any(getattr(args, d, None) != parser.get_default(d) for d in dests)


def _hosts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Optional[List[hostlist.Host]]:
    """The hosts of -H or --hostfile; None when neither is given (every rank here)."""
    try:
        if args.hosts is not None:
            return hostlist.parse_hosts(args.hosts)
        if args.hostfile is not None:
            return hostlist.parse_hostfile(args.hostfile)
    except hostlist.HostsError as exc:
        parser.error(str(exc))
    return None


def _dial_back(name: str, ssh: spawn.SshOptions) -> str:
    """The address of this machine that host ``name`` reaches it on."""
    addresses = hostlist.resolve(name)
    if not addresses:
        target = spawn.ssh_hostname(name, ssh)
        addresses = hostlist.resolve(target) if target else []
    if not addresses:
        raise hostlist.HostsError(
            f"host {name!r} does not resolve here, so netreduce-run cannot tell which of "
            f"this machine's addresses it reaches; name the aggregator with --switch HOST:PORT")
    return hostlist.route_source(addresses[0])


def _threads(extra: Sequence[str]) -> int:
    """--threads among the daemon's extra arguments (its default otherwise)."""
    for i, arg in enumerate(extra[:-1]):
        if arg == "--threads":
            try:
                return max(1, int(extra[i + 1]))
            except ValueError:
                break  # the daemon will say what is wrong with it
    return int(SWITCH_DEFAULTS["threads"])


def _embedded_aggregator(args: argparse.Namespace, remote: List[str], ssh: spawn.SshOptions,
                         verbose: bool, wait: bool = True):
    """Start the job's aggregator on a port picked here. Returns (the process, {host:
    address it dials}, address for this machine's ranks); the process is a
    SwitchProcess that listens, or with ``wait=False`` a switch.child.Starting: the
    static job starts its ranks beside it (their first connection is tried again
    until it listens, up to NETREDUCE_START_TIMEOUT) and waits for its ready line
    after starting them."""
    extra: List[str] = []
    for arg in args.switch_arg:
        extra += arg.split("=", 1) if arg.startswith("--") and "=" in arg else [arg]
    # The daemon serves TLS when the user's NETREDUCE_TLS_CERT says so; otherwise it is
    # plain and the ranks are told so (run()).
    tls_args = None if tls.job_server_files() else []
    udp_ports = _threads(extra) + 1  # the data threads' ports and the multicast group's
    if not remote:
        # All ranks share this machine: one multicast result per slot beats N copies.
        port = free_aggregator_port("127.0.0.1", udp_ports)
        proc = spawn_for_job("127.0.0.1", port=port, wait=False, fanout="multicast",
                             tls_args=tls_args, extra_args=extra)
        return (proc.ready(DAEMON_START_S) if wait else proc), {}, f"127.0.0.1:{port}"
    dial = {name: _dial_back(name, ssh) for name in remote}
    sources = sorted(set(dial.values()))
    bind = sources[0] if len(sources) == 1 else ("::" if any(":" in s for s in sources) else "0.0.0.0")
    # Reachable from other hosts, so it admits only this job's secret holders; unicast
    # fan-out, as a multicast group would leave through whatever route 224/4 takes.
    port = free_aggregator_port(bind, udp_ports)
    proc = spawn_for_job(bind, port=port, wait=False, fanout="unicast", tls_args=tls_args,
                         extra_args=extra)
    per_host = {name: format_address((addr, port)) for name, addr in dial.items()}
    here = format_address(connect_address((bind, port)))
    if verbose:
        print(f"netreduce-run: aggregator starting on {format_address((bind, port))}; "
              + ", ".join(f"{h} dials {a}" for h, a in per_host.items()),
              file=sys.stderr, flush=True)
    return (proc.ready(DAEMON_START_S) if wait else proc), per_host, here


def rank_environment(base: Mapping[str, str], slot: hostlist.Slot, switch: str,
                     host_label: bool) -> Dict[str, str]:
    """One rank's variables: netreduce's, torch's (init_process_group works unchanged)
    and horovodrun's (Horovod code and netreduce/environment.py agree)."""
    env = dict(base)
    env.update(NETREDUCE_SWITCH=switch, NETREDUCE_RANK=str(slot.rank),
               NETREDUCE_SIZE=str(slot.size), NETREDUCE_LOCAL_RANK=str(slot.local_rank),
               NETREDUCE_LOCAL_SIZE=str(slot.local_size),
               RANK=str(slot.rank), WORLD_SIZE=str(slot.size), LOCAL_RANK=str(slot.local_rank),
               LOCAL_WORLD_SIZE=str(slot.local_size), GROUP_RANK=str(slot.cross_rank),
               HOROVOD_HOSTNAME=slot.host, HOROVOD_RANK=str(slot.rank),
               HOROVOD_SIZE=str(slot.size), HOROVOD_LOCAL_RANK=str(slot.local_rank),
               HOROVOD_LOCAL_SIZE=str(slot.local_size), HOROVOD_CROSS_RANK=str(slot.cross_rank),
               HOROVOD_CROSS_SIZE=str(slot.cross_size))
    if host_label:
        env["NETREDUCE_HOST_LABEL"] = slot.host
    return env


def run(argv: Optional[Sequence[str]] = None) -> int:
    parser, elastic_dests = build_parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given")
    if elastic_dests and _elastic_requested(parser, args, elastic_dests):
        elastic = _elastic_module()
        return int(elastic.run(args, command))
    if args.np is None:
        parser.error("-np/--num-proc is required")
    if args.np < 1:
        parser.error("-np must be at least 1")
    given = _hosts(parser, args)
    hosts = given if given is not None else [hostlist.Host("localhost", args.np)]
    try:
        slots = hostlist.assign(hosts, args.np)
    except hostlist.HostsError as exc:
        parser.error(str(exc))
    used = list(dict.fromkeys(s.host for s in slots))
    local = {h: True for h in used} if given is None else {h: hostlist.is_local(h) for h in used}
    remote = [h for h in used if not local[h]]
    ssh = spawn.SshOptions(port=args.ssh_port, identity_file=args.ssh_identity_file,
                           connect_timeout_s=args.start_timeout or DEFAULT_CONNECT_TIMEOUT_S)
    if args.verbose:
        for h in used:
            ranks = [s.rank for s in slots if s.host == h]
            print(f"netreduce-run: host {h} ({'this machine' if local[h] else 'ssh'}): "
                  f"ranks {ranks}", file=sys.stderr, flush=True)

    address = args.switch or config.get("NETREDUCE_SWITCH")
    if address:
        try:
            address = ",".join(format_address(a) for a in parse_addresses(
                address, what="--switch" if args.switch else "NETREDUCE_SWITCH"))
        except ValueError as exc:
            parser.error(str(exc))

    output = spawn.Output(prefix=not args.no_prefix, output_dir=args.output_filename,
                          size=args.np, timestamp=args.prefix_timestamp)
    # ssh to the remote hosts first, one connection per host: their handshakes and
    # logins overlap with the aggregator's start; each host's keeper waits for its
    # ranks' descriptions (Job).
    connected: Dict[int, spawn.RemoteRank] = {}
    try:
        for h in remote:
            conn = spawn.connect_host(h, [s.rank for s in slots if s.host == h], output=output,
                                      ssh=ssh, verbose=args.verbose)
            connected.update(conn.ranks)
    except spawn.LaunchError as exc:
        stop(list(connected.values()), signal.SIGKILL, grace_s=0.0)
        print(f"netreduce-run: {exc}", file=sys.stderr)
        return exc.code
    try:
        return _run_job(args, command, address, slots, local, remote, ssh, output, connected,
                        host_label=given is not None)
    finally:
        stop(list(connected.values()), signal.SIGKILL, grace_s=0.0)  # any Job never took
        output.close()


def _run_job(args: argparse.Namespace, command: List[str], address: str,
             slots: List[hostlist.Slot], local: Dict[str, bool], remote: List[str],
             ssh: spawn.SshOptions, output: spawn.Output,
             connected: Dict[int, spawn.RemoteRank], host_label: bool) -> int:
    """The aggregator, the ranks' environment and the job, once the remote ranks are
    connected."""
    starting = switch_proc = None
    per_host: Dict[str, str] = {}
    if not address:
        try:
            starting, per_host, address = _embedded_aggregator(args, remote, ssh, args.verbose,
                                                               wait=False)
        except hostlist.HostsError as exc:
            print(f"netreduce-run: {exc}", file=sys.stderr)
            return 2
        except NetReduceError as exc:
            print(f"netreduce-run: cannot start the job's aggregator: {exc}", file=sys.stderr)
            return 1

    job_name = args.job or config.get("NETREDUCE_JOB") or \
        f"run-{os.getpid()}-{secrets.token_hex(4)}"
    # The job's secret (netreduce/protocol/auth.py): the user's, else a fresh one per run.
    job_secret = auth.job_secret_or_new()
    knobs = dict(horovod_flags.knobs(args), NETREDUCE_JOB=job_name,
                 NETREDUCE_JOB_SECRET=job_secret)
    for line in horovod_flags.notes(args):
        print(line, file=sys.stderr, flush=True)
    if args.start_timeout:
        knobs["NETREDUCE_START_TIMEOUT"] = args.start_timeout
    base = config.child_environment(**knobs)
    if switch_proc is not None and not tls.job_server_files():
        base.pop("NETREDUCE_TLS_CA", None)  # the embedded aggregator speaks plain TCP
    base["PYTHONUNBUFFERED"] = "1"  # ranks' lines reach the prefixer as they are printed
    if "MASTER_ADDR" not in base:
        first = slots[0].host
        if not remote:
            base["MASTER_ADDR"] = "127.0.0.1"
        elif local[first]:  # rank 0 here: the address the remote hosts dial back to
            try:
                base["MASTER_ADDR"] = _dial_back(remote[0], ssh)
            except hostlist.HostsError:
                base["MASTER_ADDR"] = first
        else:
            resolved = hostlist.resolve(first)
            base["MASTER_ADDR"] = resolved[0] if resolved else first
    base.setdefault("MASTER_PORT", str(free_tcp_port()))

    def env_of(slot: hostlist.Slot) -> Dict[str, str]:
        switch = per_host.get(slot.host, address)
        return rank_environment(base, slot, switch, host_label=host_label)

    received: List[int] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    job = None
    try:
        try:
            job = Job(command, slots, env_of, local, output, ssh, verbose=args.verbose,
                      connected=connected)
            connected.clear()  # the job's now
        except spawn.LaunchError as exc:
            print(f"netreduce-run: {exc}", file=sys.stderr)
            return exc.code
        if starting is not None:  # the ranks came up beside it; now it must listen
            try:
                switch_proc, starting = starting.ready(DAEMON_START_S), None
            except NetReduceError as exc:  # ready() killed it
                print(f"netreduce-run: the job's aggregator did not start: {exc}; stopping "
                      "the ranks", file=sys.stderr, flush=True)
                stop(job.ranks, signal.SIGTERM)
                return 1
        return job.supervise(received)
    finally:
        if job is not None:
            job.finish()
        if switch_proc is not None:
            switch_proc.stop()
        elif starting is not None:
            starting.stop()
        for s, handler in old.items():
            signal.signal(s, handler)


def main(argv: Optional[Sequence[str]] = None) -> None:
    sys.exit(run(argv))
