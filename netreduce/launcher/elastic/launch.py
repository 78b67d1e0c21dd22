"""An elastic netreduce-run: the aggregator, the job's environment, the workers.

As a fixed-size netreduce-run does (launcher/command.py): the aggregator is
``--switch``/NETREDUCE_SWITCH, else one started here — on 127.0.0.1 when the hosts
known at start are all this machine, else where the remote hosts reach this machine
(an elastic job that will add remote hosts later and starts on this machine alone
needs ``--switch``); the job gets a name and a fresh secret; a worker runs locally
when its host name is this machine, else over ssh (launcher/spawn.py), with every
rank variable of its first place (command.rank_environment). Every worker also gets
the driver's address as its host reaches it (NETREDUCE_ELASTIC), its name there
(NETREDUCE_ELASTIC_WORKER, HOST:SLOT) and the epoch; init() then asks the driver for
its place, at start and after each reset (netreduce/worker/elastic_member.py)."""
from __future__ import annotations

import argparse
import os
import secrets
import sys
from typing import Any, Dict, List

from netreduce import config
from netreduce.launcher import command as static
from netreduce.launcher import hosts as hostlist
from netreduce.launcher import job as static_job
from netreduce.launcher import spawn
from netreduce.launcher.elastic import ElasticUsageError, settings_from
from netreduce.launcher.elastic.assignment import Slot
from netreduce.launcher.elastic.discovery import DiscoveryError
from netreduce.launcher.elastic.driver import Driver
from netreduce.protocol import auth, tls
from netreduce.protocol.address import format_address, parse_addresses


class Placement:
    """Where each host's workers run and which addresses they dial (the aggregator's,
    the driver's): fixed for the hosts known at start, found for later ones."""

    def __init__(self, ssh: spawn.SshOptions, remote_listen: bool) -> None:
        self.ssh = ssh
        self.remote_listen = remote_listen  # the job's servers listen beyond loopback
        self.local: Dict[str, bool] = {}
        self.dial: Dict[str, str] = {}

    def is_local(self, host: str) -> bool:
        if host not in self.local:
            self.local[host] = hostlist.is_local(host)
        return self.local[host]

    def address_for(self, host: str) -> str:
        """The address of this machine that ``host`` reaches it on."""
        if self.is_local(host) or not self.remote_listen:
            return "127.0.0.1"
        if host not in self.dial:
            self.dial[host] = static._dial_back(host, self.ssh)
        return self.dial[host]


def run(args: argparse.Namespace, command: List[str]) -> int:
    try:
        settings = settings_from(args)
        first_hosts = list(settings.discovery.find())
    except DiscoveryError as exc:  # a misconfiguration: fail now, as Horovod does
        print(f"netreduce-run: error: {exc}", file=sys.stderr)
        return 1
    except (ElasticUsageError, hostlist.HostsError, OSError) as exc:
        print(f"netreduce-run: error: {exc}", file=sys.stderr)
        return 2
    ssh = spawn.SshOptions(port=getattr(args, "ssh_port", None),
                           identity_file=getattr(args, "ssh_identity_file", None),
                           connect_timeout_s=getattr(args, "start_timeout", None) or
                           static.DEFAULT_CONNECT_TIMEOUT_S)
    remote = [h for h in first_hosts if not hostlist.is_local(h)]
    placement = Placement(ssh, remote_listen=bool(remote))
    verbose = bool(getattr(args, "verbose", False))
    switch_proc = None
    address = getattr(args, "switch", None) or config.get("NETREDUCE_SWITCH")
    per_host: Dict[str, str] = {}
    try:
        if address:
            address = ",".join(format_address(a) for a in parse_addresses(
                address, what="--switch" if getattr(args, "switch", None) else "NETREDUCE_SWITCH"))
        else:
            switch_proc, per_host, address = static._embedded_aggregator(args, remote, ssh, verbose)
    except (ValueError, hostlist.HostsError) as exc:
        print(f"netreduce-run: error: {exc}", file=sys.stderr)
        return 2
    output = spawn.Output(prefix=not getattr(args, "no_prefix", False),
                          output_dir=getattr(args, "output_filename", None),
                          size=settings.max_np or max(settings.np, 8),
                          timestamp=getattr(args, "prefix_timestamp", False))
    try:
        job = getattr(args, "job", None) or config.get("NETREDUCE_JOB") or \
            f"run-{os.getpid()}-{secrets.token_hex(4)}"
        secret = auth.job_secret_or_new()
        knobs: Dict[str, Any] = dict(NETREDUCE_JOB=job, NETREDUCE_JOB_SECRET=secret)
        if getattr(args, "start_timeout", None):
            knobs["NETREDUCE_START_TIMEOUT"] = args.start_timeout
        base = config.child_environment(**knobs)
        if switch_proc is not None and not tls.job_server_files():
            base.pop("NETREDUCE_TLS_CA", None)  # the embedded aggregator speaks plain TCP
        base["PYTHONUNBUFFERED"] = "1"
        holder: List[Driver] = []

        def switch_for(host: str) -> str:
            if host in per_host or switch_proc is None or placement.is_local(host):
                return per_host.get(host, address)
            per_host[host] = format_address((placement.address_for(host), switch_proc.address[1]))
            return per_host[host]

        def start_worker(slot: Slot, epoch: int) -> Any:
            place = hostlist.Slot(slot.host, slot.rank, slot.local_rank, slot.cross_rank,
                                  slot.size, slot.local_size, slot.cross_size)
            env = static.rank_environment(base, place, switch_for(slot.host), host_label=True)
            env.update(NETREDUCE_ELASTIC=format_address(
                (placement.address_for(slot.host), holder[0].address[1])),
                NETREDUCE_ELASTIC_WORKER=slot.name, NETREDUCE_EPOCH=str(epoch))
            return spawn.start(command, slot.rank, slot.host, env,
                               local=placement.is_local(slot.host), output=output, ssh=ssh,
                               verbose=verbose)

        listen = "127.0.0.1" if not remote else ("::" if any(":" in placement.address_for(h)
                                                             for h in remote) else "0.0.0.0")
        driver = Driver(settings, job, secret, start_worker, host=listen,
                        stop_workers=static_job.stop)
        holder.append(driver)
        return driver.run()
    finally:
        output.close()
        if switch_proc is not None:
            switch_proc.stop()
