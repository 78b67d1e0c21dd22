"""netreduce: in-network aggregation all-reduce for distributed DNN training.

    import netreduce as nr
    nr.init()
    avg = nr.allreduce(grad)                 # Average over all ranks, via the aggregator
    h = nr.allreduce_async(grad, name="w")   # ... nr.synchronize(h)
    nr.shutdown()

The public names load on first use (PEP 562): ``import netreduce.switch.daemon``
must not load the worker, the algorithms or the API (the layer rule, docs/design.md
"Layers"; tests/unit/test_lazy_root.py checks it in a fresh interpreter). Each name
is listed once, in ``_PUBLIC``; the ``TYPE_CHECKING`` imports below repeat them for
type checkers and editors, and the test keeps the two equal.
"""
import importlib as _importlib
import sys as _sys
import types as _types
import typing as _typing

from netreduce._version import __version__
from netreduce import _source_tree

_source_tree.install()  # a checkout imported without being built says so (_source_tree.py)

# public name -> the module that defines it
_PUBLIC: _typing.Dict[str, str] = {
    "NetReduceError": "netreduce.errors",
    **dict.fromkeys(("ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum"),
                    "netreduce.ops"),
    "Handle": "netreduce.worker.handle",
    **dict.fromkeys((
        "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
        "allreduce", "allreduce_", "allreduce_async", "grouped_allreduce",
        "grouped_allreduce_", "grouped_allreduce_async", "broadcast", "broadcast_",
        "broadcast_async", "broadcast_object", "allgather_object", "barrier", "join", "poll",
        "synchronize", "start_timeline", "stop_timeline"), "netreduce.api"),
    **dict.fromkeys(("alltoall", "alltoall_async"), "netreduce.alltoall"),
}
# Sub-packages `import netreduce` used to load as a side effect: `netreduce.api`,
# `netreduce.config`, ... after a bare `import netreduce` keep working.
_SUBMODULES = frozenset(("algorithms", "api", "config", "environment", "errors", "ops",
                         "process", "protocol", "switch", "worker"))

__all__ = ["__version__", *_PUBLIC]

if _typing.TYPE_CHECKING:  # the same names, for type checkers (kept equal to _PUBLIC by a test)
    from netreduce.alltoall import alltoall, alltoall_async
    from netreduce.api import (allgather_object, allreduce, allreduce_, allreduce_async,
                               barrier, broadcast, broadcast_, broadcast_async,
                               broadcast_object, grouped_allreduce, grouped_allreduce_,
                               grouped_allreduce_async, init, is_initialized, join,
                               local_rank, local_size, poll, rank, shutdown, size,
                               start_timeline, stop_timeline, synchronize)
    from netreduce.errors import NetReduceError
    from netreduce.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
    from netreduce.worker.handle import Handle


def __getattr__(name: str) -> _typing.Any:
    where = _PUBLIC.get(name)
    if where is not None:
        value = getattr(_importlib.import_module(where), name)
    elif name in _SUBMODULES:
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later uses are plain lookups
    return value


def __dir__() -> _typing.List[str]:
    return sorted(set(globals()) | set(_PUBLIC))


class _Root(_types.ModuleType):
    """The import system binds a loaded sub-module on its package by setattr; the
    sub-module `netreduce.alltoall` must not take the place of the function
    `netreduce.alltoall` that way (an eager import rebound the function after it)."""

    def __setattr__(self, name: str, value: _typing.Any) -> None:
        if isinstance(value, _types.ModuleType) and _PUBLIC.get(name) == value.__name__:
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Root
