"""netreduce-run's elastic mode: horovodrun's elastic flags and semantics.

    netreduce-run -np 4 --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh python train.py
    netreduce-run -np 4 --min-np 2 -H a:2,b:2 python train.py

``add_arguments(parser)`` adds the flags to netreduce-run's parser (launcher/command.py
calls it); ``is_elastic(args)`` says whether they ask for an elastic job; ``run(args,
command)`` runs it and returns the exit code. The driver is driver.py, what the
workers do netreduce/elastic.py, the aggregator's side netreduce/switch/epochs.py;
docs/elastic.md tells the whole story.
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, Sequence

from netreduce import config
from netreduce.errors import ConfigError
from netreduce.launcher import hosts as hostlist
from netreduce.launcher.elastic.discovery import (COOLDOWN_CEILING_S, COOLDOWN_FLOOR_S,
                                                  FixedHosts, ScriptDiscovery, host_slots)

DEFAULT_ELASTIC_TIMEOUT_S = 600  # Horovod's ELASTIC_TIMEOUT_SECS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """horovodrun's elastic flags (same names, destinations and defaults)."""
    group = parser.add_argument_group("elastic arguments")
    group.add_argument("--min-np", "--min-num-proc", dest="min_num_proc", type=int,
                       help="minimum number of processes for training to continue; below it, "
                            "training waits (--elastic-timeout) for more (default: -np)")
    group.add_argument("--max-np", "--max-num-proc", dest="max_num_proc", type=int,
                       help="maximum number of processes; more slots are left unused "
                            "(default: no limit)")
    group.add_argument("--slots-per-host", dest="slots", type=int,
                       help="slots of a host whose discovery line gives none "
                            "(host:slots lines override it)")
    group.add_argument("--elastic-timeout", dest="elastic_timeout", type=int,
                       help="seconds to wait for --min-np slots at start and after each reset "
                            f"(default: {DEFAULT_ELASTIC_TIMEOUT_S})")
    group.add_argument("--reset-limit", dest="reset_limit", type=int,
                       help="the job fails once it would reset (shrink or grow) more often "
                            "than this (default: no limit)")
    group.add_argument("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2,
                       metavar=("MIN", "MAX"),
                       help="seconds a failing host stays blacklisted: MIN*2^k plus up to MIN "
                            "at random for its k-th failure, within [MIN, MAX] "
                            "(default: blacklisted for good)")
    if not _has_option(parser, "--host-discovery-script"):
        group.add_argument("--host-discovery-script", dest="host_discovery_script",
                           help="executable that prints the available hosts, one host:slots "
                                "per line; run every second (enables elastic mode)")


def _has_option(parser: argparse.ArgumentParser, option: str) -> bool:
    return any(option in action.option_strings for action in parser._actions)


def is_elastic(args: argparse.Namespace) -> bool:
    """Horovod's rule: a discovery script or --min-np makes a job elastic; --max-np
    (or any other elastic flag) without hosts that can change is refused by run()."""
    return any(getattr(args, name, None) is not None for name in
               ("host_discovery_script", "min_num_proc", "max_num_proc", "slots",
                "elastic_timeout", "reset_limit", "cooldown_range"))


class ElasticUsageError(ConfigError):
    """Flags that cannot run an elastic job; netreduce-run reports it as a usage error."""


def settings_from(args: argparse.Namespace):
    """The driver's settings from netreduce-run's arguments (ElasticUsageError)."""
    from netreduce.launcher.elastic.driver import Settings
    np_ = getattr(args, "np", None) or getattr(args, "num_proc", None)
    min_np = args.min_num_proc if getattr(args, "min_num_proc", None) is not None else np_
    max_np = getattr(args, "max_num_proc", None)
    if np_ is None:
        raise ElasticUsageError("-np is required: the number of processes the job needs to start")
    if min_np is None or min_np < 1 or np_ < min_np:
        raise ElasticUsageError(f"--min-np {min_np} must be at least 1 and at most -np {np_}")
    if max_np is not None and max_np < np_:
        raise ElasticUsageError(f"--max-np {max_np} is below -np {np_}")
    cooldown = getattr(args, "cooldown_range", None)
    if cooldown is not None:
        low, high = cooldown
        if low < COOLDOWN_FLOOR_S or high > COOLDOWN_CEILING_S or low > high:
            raise ElasticUsageError(
                f"--blacklist-cooldown-range {low} {high}: want {COOLDOWN_FLOOR_S} <= MIN <= MAX "
                f"<= {COOLDOWN_CEILING_S}")
        cooldown = (int(low), int(high))
    slots = getattr(args, "slots", None)
    script = getattr(args, "host_discovery_script", None)
    if script and (getattr(args, "hosts", None) or getattr(args, "hostfile", None)):
        raise ElasticUsageError("give either --host-discovery-script or -H/--hostfile, not both")
    if script:
        discovery: Any = ScriptDiscovery(script, slots)
    else:
        host_slots = _fixed_hosts(args)
        if len(host_slots) < 2:
            raise ElasticUsageError(
                "an elastic job needs hosts that can change: pass --host-discovery-script, or "
                "at least two hosts with -H/--hostfile (with one host there is nothing to "
                "continue on)")
        discovery = FixedHosts(host_slots, "-H" if getattr(args, "hosts", None) else "--hostfile")
    timeout = getattr(args, "elastic_timeout", None)
    limit = getattr(args, "reset_limit", None)
    if limit is not None and limit < 0:
        raise ElasticUsageError(f"--reset-limit {limit} is negative")
    return Settings(np=np_, min_np=min_np, max_np=max_np, discovery=discovery,
                    elastic_timeout=float(DEFAULT_ELASTIC_TIMEOUT_S if timeout is None else timeout),
                    reset_limit=limit, cooldown=cooldown, verbose=bool(getattr(args, "verbose", False)),
                    ahead_s=float(config.get("NETREDUCE_ELASTIC_AHEAD")))


def _fixed_hosts(args: argparse.Namespace) -> Dict[str, int]:
    """-H host:slots,... or --hostfile."""
    try:
        if getattr(args, "hosts", None):
            return host_slots(hostlist.parse_hosts(args.hosts))
        if getattr(args, "hostfile", None):
            return host_slots(hostlist.parse_hostfile(args.hostfile))
    except hostlist.HostsError as exc:
        raise ElasticUsageError(str(exc)) from None
    return {}


def run(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run ``command`` as an elastic job; the exit code."""
    from netreduce.launcher.elastic import launch
    return launch.run(args, list(command))


__all__ = ["add_arguments", "is_elastic", "run", "settings_from", "ElasticUsageError"]
