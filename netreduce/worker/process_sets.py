"""Process sets: collectives among a subset of the job's ranks (Horovod's
``add_process_set``).

Each set is a sub-job to the aggregator: its own admission (job name
``<job>.ps<id>``, ranks numbered 0..k-1 in the set's order), its own slots and its
own negotiation log, so that a set's collectives never line up with — or wait
for — those of the job or of another set. Its members run one more communicator
(negotiation and executor threads) over a flat data-plane connection; the other
ranks hold only the set's description.

Every rank of the job must call ``add_process_set`` and ``remove_process_set`` in the
same order (as in Horovod): ids are handed out in call order, so they agree across
ranks without any exchange.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from netreduce.errors import InvalidArgumentError, NetReduceError
from netreduce.worker import context


class ProcessSet:
    """A subset of the job's ranks (sorted); id 0 is the whole job."""

    def __init__(self, ranks: Optional[Sequence[int]] = None) -> None:
        self.ranks: Optional[List[int]] = sorted(int(r) for r in ranks) if ranks is not None \
            else None
        self.process_set_id: Optional[int] = None
        self.comm: Any = None  # this rank's communicator of the set (members only)

    def _job_ranks(self) -> List[int]:
        return list(range(context.size())) if self.ranks is None else self.ranks

    def included(self) -> bool:
        return context.rank() in self._job_ranks()

    def size(self) -> int:
        return len(self._job_ranks())

    def rank(self) -> int:
        """This rank's position in the set (-1 when it is not a member)."""
        ranks = self._job_ranks()
        return ranks.index(context.rank()) if context.rank() in ranks else -1

    def __repr__(self) -> str:
        if self.process_set_id == 0:
            return "global_process_set"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self._job_ranks()})"


global_process_set = ProcessSet()
global_process_set.process_set_id = 0

_lock = threading.Lock()
_sets: Dict[int, ProcessSet] = {}
_next_id = [1]


def add_process_set(process_set: Any) -> ProcessSet:
    """Register a set (a ProcessSet or a list of ranks) on every rank; members join
    the set's sub-job at the aggregator (this waits until every member has)."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.ranks is None:
        raise InvalidArgumentError("add_process_set(): the global process set is always registered")
    size = context.size()
    bad = [r for r in ps.ranks if not 0 <= r < size]
    if bad or len(set(ps.ranks)) != len(ps.ranks) or not ps.ranks:
        raise InvalidArgumentError(f"add_process_set(): ranks {ps.ranks} must be distinct ranks of "
                         f"the job (0..{size - 1})")
    if ps.process_set_id is not None:
        raise InvalidArgumentError(f"add_process_set(): {ps} is already registered")
    with _lock:
        for other in _sets.values():  # torch sub-groups (string ids) may share ranks
            if isinstance(other.process_set_id, int) and other.ranks == ps.ranks:
                raise InvalidArgumentError(f"add_process_set(): a process set with ranks {ps.ranks} "
                                 f"already exists ({other})")
        ps.process_set_id = _next_id[0]
        _next_id[0] += 1
        _sets[ps.process_set_id] = ps
    if context.rank() in ps.ranks:
        _open_communicator(ps, f"ps{ps.process_set_id}")
    return ps


def add_members_only(ranks: Sequence[int]) -> ProcessSet:
    """A set created by its members alone (a torch.distributed sub-group: torch
    creates the backend on the group's ranks only). Its sub-job is named by its
    ranks and by how many such sets with those ranks this rank has made, which
    every member counts alike."""
    import hashlib
    ps = ProcessSet(ranks)
    if context.rank() not in ps.ranks:
        raise InvalidArgumentError(f"rank {context.rank()} is not in {ps.ranks}")
    digest = hashlib.sha1(",".join(map(str, ps.ranks)).encode()).hexdigest()[:12]
    with _lock:
        nth = _group_counts.get(digest, 0)
        _group_counts[digest] = nth + 1
        ps.process_set_id = f"g{digest}.{nth}"
        _sets[ps.process_set_id] = ps
    _open_communicator(ps, ps.process_set_id)
    return ps


def _open_communicator(ps: ProcessSet, job: str) -> None:
    """This rank's communicator of registered set ``ps``, its sub-job named ``job``; a set
    whose communicator cannot open is registered no more."""
    try:
        ps.comm = context.sub_communicator(job, ps.ranks.index(context.rank()), len(ps.ranks))
    except BaseException:
        with _lock:
            _sets.pop(ps.process_set_id, None)
        raise


_group_counts: Dict[str, int] = {}


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set (every rank, same order); False if it was not registered."""
    if process_set is global_process_set or process_set.process_set_id is None:
        return False
    with _lock:
        found = _sets.pop(process_set.process_set_id, None)
    if found is None:
        return False
    comm, found.comm = found.comm, None
    if comm is not None:
        try:
            comm.shutdown()
        finally:
            comm.dp.close()
    found.process_set_id = None
    return True


def remove_all() -> None:
    """At shutdown: leave every set's sub-job."""
    for ps in list(_sets.values()):
        remove_process_set(ps)
    _next_id[0] = 1
    _group_counts.clear()


def lookup(process_set_id: Any) -> ProcessSet:
    """The registered set with this id (0 is the whole job): what an adapter that
    carries only the id (a graph op's attribute) hands to ``using``."""
    if process_set_id in (0, None):
        return global_process_set
    with _lock:
        found = _sets.get(process_set_id)
    if found is None:
        raise InvalidArgumentError(f"process set id {process_set_id!r} is not registered "
                                   "(add_process_set() on every rank first)")
    return found


@contextlib.contextmanager
def using(process_set: Any) -> Iterator[None]:
    """Run the core calls inside on ``process_set``'s communicator (the global one
    for None or global_process_set)."""
    if process_set is None or process_set is global_process_set or \
            getattr(process_set, "process_set_id", None) == 0:
        yield
        return
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id not in _sets:
        raise InvalidArgumentError(f"process set {process_set!r} is not registered "
                         "(add_process_set() on every rank first)")
    if process_set.comm is None:
        raise NetReduceError(f"rank {context.rank()} is not a member of {process_set}: only its "
                             "ranks may call collectives on it")
    previous = getattr(context.thread, "comm", None), getattr(_active, "ps", None)
    context.thread.comm, _active.ps = process_set.comm, process_set
    try:
        yield
    finally:
        context.thread.comm, _active.ps = previous


_active = threading.local()


def current() -> ProcessSet:
    """The set whose communicator the calling thread is using now."""
    return getattr(_active, "ps", None) or global_process_set


def check(process_set: Any) -> "ProcessSet":
    """``process_set`` if it is a ProcessSet, else InvalidArgumentError (a ValueError)."""
    if not isinstance(process_set, ProcessSet):
        raise InvalidArgumentError(f"process_set must be a ProcessSet (global_process_set or one "
                                   f"from add_process_set()), got {type(process_set).__name__}")
    return process_set


def root_in_set(root_rank: int, process_set: "ProcessSet") -> int:
    """The set rank of a broadcast root that Horovod's callers name by its job rank."""
    if process_set.ranks is None:
        return root_rank
    if root_rank not in process_set.ranks:
        raise InvalidArgumentError(f"root_rank {root_rank} is not in {process_set}")
    return process_set.ranks.index(root_rank)


def on_process_set(fn: Callable) -> Callable:
    """An adapter function whose core calls run on the communicator of its
    ``process_set=`` argument (default: the job). The adapters wrap their
    Horovod-signature collectives with it, so inside them api.size()/rank() are the
    set's.

    The argument is found by its position, worked out once here: binding every call's
    arguments (``Signature.bind_partial``) cost ~11 µs a call, more than a steady 4 KiB
    all-reduce's own Python. The global set needs no switch (``using`` leaves the
    thread's communicator as it is for it), so a call on it goes straight through."""
    params = list(inspect.signature(fn).parameters.values())
    names = [p.name for p in params]
    at = names.index("process_set")
    by_position = params[at].kind == params[at].POSITIONAL_OR_KEYWORD  # else keyword-only
    default = params[at].default if params[at].default is not params[at].empty \
        else global_process_set

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ps = args[at] if by_position and len(args) > at else kwargs.get("process_set", default)
        if ps is global_process_set:
            return fn(*args, **kwargs)
        with using(check(ps)):
            return fn(*args, **kwargs)
    return wrapper
