"""horovodrun's tuning flags on netreduce-run: each one that has a netreduce knob
sets that knob on every rank; a few that mean nothing here are accepted so that a
horovodrun command line still runs, with one line saying so. Every other horovodrun
flag is refused by the parser (docs/horovodrun.md says why, flag by flag; the
elastic ones belong to netreduce.launcher.elastic).

One table, read by add_arguments() (the parser), knobs() (the ranks' variables) and
tests/unit/test_launch_horovod_flags.py (which holds docs/horovodrun.md to it)."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Callable, Dict, List, Optional


@dataclasses.dataclass(frozen=True)
class KnobFlag:
    flags: tuple
    knob: str
    type: Callable
    convert: Callable = str
    help: str = ""


MIB = 1024 * 1024

KNOB_FLAGS = [
    KnobFlag(("--fusion-threshold-mb",), "NETREDUCE_FUSION_THRESHOLD", int,
             lambda mb: str(mb * MIB), "fusion buffer in MiB (0: no fusion)"),
    KnobFlag(("--cycle-time-ms",), "NETREDUCE_CYCLE_TIME", float, str,
             "ms to wait for more tensors to batch into one negotiation"),
    KnobFlag(("--cache-capacity",), "NETREDUCE_CACHE_CAPACITY", int, str,
             "tensor names the response cache remembers"),
    KnobFlag(("--timeline-filename",), "NETREDUCE_TIMELINE", str, str,
             "Chrome trace of every tensor's phases, written by rank 0"),
    KnobFlag(("--stall-check-warning-time-seconds",), "NETREDUCE_STALL_TIMEOUT", float, str,
             "seconds before a warning names a tensor some ranks have not submitted"),
    KnobFlag(("--gloo-timeout-seconds",), "NETREDUCE_TIMEOUT", float, str,
             "seconds an operation may wait before failing"),
]

# Accepted, and what netreduce-run says about them (None: nothing to say).
NO_EFFECT: Dict[str, Optional[str]] = {
    "--disable-cache": None,  # netreduce-run runs no checks to cache
    "--gloo": None,           # netreduce-run starts ranks the way horovodrun's Gloo mode does
    "--timeline-mark-cycles": "netreduce's timeline has no cycle marks",
    "--no-stall-check": "netreduce always warns of a stall; raise "
                        "--stall-check-warning-time-seconds instead",
    "--log-without-timestamp": "netreduce's log lines carry no timestamp",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("horovodrun's tuning flags (each sets a netreduce knob)")
    for f in KNOB_FLAGS:
        group.add_argument(*f.flags, dest=_dest(f.flags[0]), type=f.type, default=None,
                           metavar="FILE" if f.type is str else "N", help=f"{f.help} ({f.knob})")
    algorithm = group.add_mutually_exclusive_group()
    algorithm.add_argument("--hierarchical-allreduce", dest="hvd_algorithm", action="store_const",
                           const="hierarchical", help="NETREDUCE_ALGORITHM=hierarchical")
    algorithm.add_argument("--no-hierarchical-allreduce", dest="hvd_algorithm",
                           action="store_const", const="flat", help="NETREDUCE_ALGORITHM=flat")
    for flag, why in NO_EFFECT.items():
        group.add_argument(flag, dest=_dest(flag), action="store_true",
                           help=f"accepted, no effect{': ' + why if why else ''}")


def _dest(flag: str) -> str:
    return "hvd_" + flag.lstrip("-").replace("-", "_")


def knobs(args: argparse.Namespace) -> Dict[str, str]:
    """The knobs the given flags set, for every rank's environment."""
    out = {}
    for f in KNOB_FLAGS:
        value = getattr(args, _dest(f.flags[0]), None)
        if value is not None:
            out[f.knob] = f.convert(value)
    if getattr(args, "hvd_algorithm", None):
        out["NETREDUCE_ALGORITHM"] = args.hvd_algorithm
    return out


def notes(args: argparse.Namespace) -> List[str]:
    """One line for each accepted flag that does nothing here and has a reason."""
    return [f"netreduce-run: {flag} has no effect: {why}" for flag, why in NO_EFFECT.items()
            if why and getattr(args, _dest(flag), False)]
