"""The job context of this process: the communicator a call uses. That is the one
netreduce.init() made (one per process), or one that a thread carries itself: the
unit tests run several ranks as threads of one process through the public API, and
a process set's calls run on the set's own communicator (process_sets.using).
netreduce.api and process_sets.py both read it here."""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from netreduce import config
from netreduce.algorithms.base import connect_settings
from netreduce.algorithms.flat import Flat
from netreduce.errors import NetReduceError
from netreduce.worker.communicator import Communicator


class State:
    """What init() made and shutdown() releases (under ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.comm: Optional[Communicator] = None
        self.topology: Any = None  # environment.Topology
        self.switch: Any = None  # the embedded aggregator of a single-process run
        self.connect: Optional[Callable[..., Any]] = None  # how init() reached the aggregator
        self.atexit_registered = False


state = State()
# A thread's own communicator (thread.comm), which wins over the process's.
thread = threading.local()


def comm() -> Communicator:
    # The thread's own dict, not getattr(thread, "comm", None): a thread without one
    # (every thread but a process set's) would raise and catch an AttributeError on
    # each call, ~4 µs of a steady step's ~25 µs of Python on the AMD boot (issue 33).
    found = thread.__dict__.get("comm") or state.comm
    if found is None:
        raise NetReduceError("netreduce has not been initialized; call netreduce.init() first")
    return found


def rank() -> int:
    return comm().rank


def size() -> int:
    return comm().size


def sub_communicator(suffix: str, rank: int, size: int) -> Communicator:
    """A communicator for a sub-job of this job (a process set): admitted at the
    (first) aggregator as job ``<job>.<suffix>``, flat data plane, its own
    negotiation; connected the way init() connected. Every member calls this
    together."""
    parent = state.comm
    if parent is None or state.connect is None:
        raise NetReduceError("netreduce has not been initialized; call netreduce.init() first")
    knobs = config.snapshot()
    job = f"{parent.job}.{suffix}"
    dp = state.connect(parent.address, job=job, rank=rank, size=size,
                       **connect_settings(knobs))
    try:
        sub = Communicator(rank=rank, size=size, job=job, address=parent.address, dataplane=dp,
                           knobs=knobs)
    except BaseException:
        dp.close()
        raise
    sub.dp = Flat(dp)
    sub.topology = parent.topology
    return sub
