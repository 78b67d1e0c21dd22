"""Horovod's elastic state and run loop (``hvd.elastic``), framework-free: the
adapters add their framework's states (netreduce.torch.elastic, .tensorflow.elastic,
.mxnet.elastic).

``run_fn(func)(state)`` runs ``func(state)`` and, when the job changes under it, brings
every rank back to a common point and runs it again:

* a collective fails because the job broke under every rank — a rank died, the
  aggregator died or restarted, the data plane timed out (``RECOVERABLE``): each rank
  rolls ``state`` back to its last ``commit()``;
* ``state.commit()`` / ``check_host_updates()`` raises ``HostsUpdatedInterrupt``
  because hosts were added or removed (only under an elastic netreduce-run, whose
  driver counts the updates: every rank raises at the same commit, having agreed on
  the latest update with one small all-reduce);

then each rank resets — ``shutdown()`` and ``init()``, which under an elastic
netreduce-run asks the driver for the rank's place in the next membership epoch, so
that ``rank()`` and ``size()`` are the new ones — runs the reset callbacks, syncs the
state from the new rank 0 (not after a pure removal: every survivor holds the same
state) and runs ``func`` again. A worker that the new membership leaves out (its host
was removed or blacklisted) ends its process with exit code 0.

Outside an elastic netreduce-run the job's size is fixed: ``init()`` rejoins the same
ranks, retried until the aggregator admits the job again or NETREDUCE_START_TIMEOUT
passes, and no host update is ever raised. Argument errors and ranks that disagree
about a tensor are not recoverable: running again would fail again.
"""
from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any, Callable, Dict, List, Tuple, Type

import numpy as np

from netreduce import api, config
from netreduce.errors import (AdmissionError, ControlPlaneError, DataPlaneError, NetReduceError,
                              OperationTimeoutError, RankFailedError, ShutdownError)
from netreduce.ops import ReduceOp
from netreduce.worker import elastic_member

log = logging.getLogger("netreduce")

RECOVERABLE: Tuple[Type[BaseException], ...] = (RankFailedError, DataPlaneError,
                                                ControlPlaneError, OperationTimeoutError,
                                                ShutdownError)
RETRY_S = 0.5  # between attempts to rejoin a job of fixed size
UPDATES_TENSOR = "netreduce.elastic.host_updates"  # the commit's agreement (one name: cached)


class HostsUpdatedInterrupt(NetReduceError):
    """Hosts were added or removed: every rank raises it at the same commit.
    ``skip_sync``: only removed, so the survivors' states are equal already."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated" + (" (removed only)" if skip_sync else ""))
        self.skip_sync = skip_sync


def host_updates() -> Tuple[bool, bool]:
    """(whether the elastic driver counted a host update that the current membership
    does not reflect, whether that update only removed hosts): one small all-reduce
    that every rank must call at the same point (a commit), so that all ranks answer
    alike. (False, False) outside an elastic netreduce-run."""
    member = elastic_member.member()
    if member is None:
        return False, False
    latest, removed, added = member.pending()
    agreed = api.allreduce(np.array([latest, int(removed), int(added)], dtype=np.int64),
                           op=ReduceOp.Max, name=UPDATES_TENSOR)
    if int(agreed[0]) <= member.synced:
        return False, False
    member.settle(int(agreed[0]))
    return True, bool(agreed[1]) and not bool(agreed[2])


class State:
    """State tracked across a reset: ``save``/``restore``/``sync`` are the framework's."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: List[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions to call after each reset (say, to rescale the learning rate)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: Any, update_res: Any) -> None:
        """Horovod's listener hook; the updates come through the driver here."""

    def commit(self) -> None:
        """Save the state (the point a failure rolls back to), then check for host
        updates (HostsUpdatedInterrupt)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt when the elastic driver counted a host update
        that the current membership does not reflect; every rank calls it together."""
        new, removed_only = host_updates()
        if new:
            raise HostsUpdatedInterrupt(skip_sync=removed_only)

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        pass


class ObjectState(State):
    """Plain Python values (keyword arguments, exposed as attributes), synced from
    rank 0 with ``bcast_object``."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int],
                 **kwargs: Any) -> None:
        self._saved_state: Dict[str, Any] = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def rejoin() -> None:
    """Leave the job and join it again. Under an elastic netreduce-run init() asks the
    driver for this rank's place in the next epoch (and retries a failed start
    itself); at a fixed size it is retried here while the aggregator (or a peer) is
    not back yet, for at most NETREDUCE_START_TIMEOUT."""
    if elastic_member.member() is not None:
        _leave()
        api.init()
        return
    deadline = time.monotonic() + float(config.get("NETREDUCE_START_TIMEOUT"))
    while True:
        _leave()
        try:
            api.init()
            return
        except RECOVERABLE + (AdmissionError,):
            if time.monotonic() >= deadline:
                raise
            time.sleep(RETRY_S)


def _leave() -> None:
    try:
        api.shutdown()
    except NetReduceError:
        pass  # the job is already broken; leaving is best effort


def run_fn(func: Callable[..., Any], reset: Callable[[], None] = rejoin,
           recoverable: Tuple[Type[BaseException], ...] = RECOVERABLE) -> Callable[..., Any]:
    """Horovod's ``elastic.run`` loop around ``func(state, ...)``."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HostsUpdatedInterrupt as exc:
                    skip_sync = exc.skip_sync
                except recoverable as exc:
                    log.info("netreduce elastic: %s; rolling back to the last commit", exc)
                    state.restore()
                    skip_sync = False
                reset()
                state.on_reset()
        except elastic_member.RemovedFromJob as exc:
            log.warning("netreduce elastic: %s; this worker exits", exc)
            sys.exit(0)  # the driver expects it: not a failure of the job
    return wrapper
