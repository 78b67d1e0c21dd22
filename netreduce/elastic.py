"""Horovod's elastic state and run loop (``hvd.elastic``), framework-free: the
adapters add their framework's states (netreduce.tensorflow.elastic).

What it recovers from, and what not: netreduce's launchers start a fixed set of
ranks, so no host is ever added or removed (``commit`` never raises
HostsUpdatedInterrupt, which is only defined for Horovod code that catches it).
What it does is Horovod's recovery path at a fixed size: when a collective fails
because the job broke under every rank — the aggregator died or restarted, a peer
shut down, the data plane timed out (``RECOVERABLE``) — each rank rolls its state
back to the last ``commit``, leaves and rejoins the job (``shutdown()`` then
``init()``, retried until the aggregator admits the job again or
NETREDUCE_START_TIMEOUT passes), rank 0's committed state is broadcast to all
(``sync``), and the function runs again. Argument errors and ranks that disagree
about a tensor are not recoverable: running again would fail again.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable, Dict, List, Tuple, Type

from netreduce import api, config
from netreduce.errors import (AdmissionError, ControlPlaneError, DataPlaneError, NetReduceError,
                              OperationTimeoutError, RankFailedError, ShutdownError)

RECOVERABLE: Tuple[Type[BaseException], ...] = (RankFailedError, DataPlaneError,
                                                ControlPlaneError, OperationTimeoutError,
                                                ShutdownError)
RETRY_S = 0.5  # between attempts to rejoin the job


class HostsUpdatedInterrupt(NetReduceError):
    """Horovod's signal that hosts were added or removed; netreduce never raises it
    (its launchers start a fixed set of ranks)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


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

    def commit(self) -> None:
        """Save the state (the point a failure rolls back to) and check for host
        changes (none can happen here; see the module's text)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        return None

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
    """Leave the job and join it again, retrying while the aggregator (or a peer) is
    not back yet, for at most NETREDUCE_START_TIMEOUT."""
    deadline = time.monotonic() + float(config.get("NETREDUCE_START_TIMEOUT"))
    while True:
        try:
            api.shutdown()
        except NetReduceError:
            pass  # the job is already broken; leaving is best effort
        try:
            api.init()
            return
        except RECOVERABLE + (AdmissionError,):
            if time.monotonic() >= deadline:
                raise
            time.sleep(RETRY_S)


def run_fn(func: Callable[..., Any], reset: Callable[[], None] = rejoin,
           recoverable: Tuple[Type[BaseException], ...] = RECOVERABLE) -> Callable[..., Any]:
    """Horovod's ``elastic.run`` loop around ``func(state, ...)``."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            except recoverable:
                state.restore()
                skip_sync = False
            reset()
            state.on_reset()
    return wrapper
