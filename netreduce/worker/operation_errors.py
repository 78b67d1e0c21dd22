"""The errors a rank's operations get from its communicator (communicator.py), each
naming what a user needs to act on: this rank, the job, the tensors, the aggregator
or the rank that left (docs/design.md, "Error reporting").

A failure the coordinator reported (another rank left or died, or the job ended
there) is the same text on every rank, busy or not: each operation it stops gets an
error of its own that names it (``for_operation``), keeping RankFailedError and its
``rank``. This rank's own failures already say what failed; one raised by the data
plane under a group gets the group's tensors in front (``naming``).
"""
from __future__ import annotations

import copy
from typing import Any, List, Optional, Sequence

from netreduce.errors import (ControlPlaneError, InvalidArgumentError, NetReduceError,
                              RankFailedError, ShutdownError, tensor_names)
from netreduce.protocol.address import format_address


def for_operation(failure: Optional[NetReduceError], reported: bool, rank: int, job: str,
                  address: Any, names: Sequence[str]) -> Optional[NetReduceError]:
    """The error an operation on tensors ``names`` gets from the job's ``failure``
    (None while the job runs), a fresh instance each time: naming it when the
    coordinator ``reported`` the failure, else a copy (a fresh traceback; keeps
    .rank)."""
    if failure is None or not reported:
        return copy.copy(failure)
    return RankFailedError(
        f"rank {rank} of job '{job}': {tensor_names(list(names))} cannot "
        f"complete: {failure}; aggregator {format_address(address)}",
        getattr(failure, "rank", -1))


def naming(exc: NetReduceError, prefix: str) -> NetReduceError:
    """``exc`` (same class, same attributes such as RankFailedError.rank) with
    ``prefix`` in front of its message, which is kept whole: it names the aggregator,
    job and slot."""
    named = copy.copy(exc)
    named.args = (f"{prefix}: {exc}",) + tuple(exc.args[1:])
    return named


def reducing_failed(rank: int, names: List[str], exc: NetReduceError) -> NetReduceError:
    """This rank's own data plane failed under a group of tensors ``names``."""
    return naming(exc, f"rank {rank}: reducing {tensor_names(names)} failed")


def reducing_bug(rank: int, names: List[str], exc: Exception) -> NetReduceError:
    """Not the data plane: a bug while reducing ``names`` (fatal for the job)."""
    return NetReduceError(f"rank {rank} failed to reduce {names[:5]}: {exc!r}")


def already_in_flight(name: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"a tensor named '{name}' is already being reduced: "
                                "names must be unique among in-flight operations "
                                "(wait for the first with synchronize())")


def after_shutdown(rank: int, job: str, names: Sequence[str]) -> ShutdownError:
    """A submission after this rank's shutdown()."""
    return ShutdownError(
        f"netreduce has been shut down on rank {rank} of job '{job}' "
        f"({tensor_names(list(names))} not submitted); to go on, "
        "call netreduce.shutdown() and then netreduce.init() on every rank: the "
        "job restarts once all of its ranks have done so")


def shut_down_in_negotiation(rank: int, job: str, name: str) -> ShutdownError:
    """A tensor still negotiated when this rank shut down."""
    return ShutdownError(
        f"netreduce was shut down on rank {rank} before every rank of job "
        f"'{job}' submitted tensor '{name}'")


def aggregator_silent(address: Any, limit: float) -> ControlPlaneError:
    return ControlPlaneError(
        f"the aggregator at {address[0]}:{address[1]} did not "
        f"answer a negotiation request within {limit:.0f} s")


def watch_lost(address: Any, exc: BaseException) -> ControlPlaneError:
    return ControlPlaneError(
        f"watch connection to {address[0]}:{address[1]} failed: {exc}")
