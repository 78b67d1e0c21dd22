"""What Horovod's API names the same way for every framework, which each adapter's
mpi_ops re-exports: the process queries (``hvd.rank()``, ``hvd.cross_size()``,
``hvd.nccl_built()``, ...), the reduce ops, the error Horovod code catches, the
timeline calls and process sets. Only ``cuda_built`` differs per framework and stays
in each adapter."""
from __future__ import annotations

from typing import Any, Type

from . import api as _api
from .api import start_timeline, stop_timeline  # noqa: F401  Horovod's run-time timeline control
from .errors import InvalidArgumentError, NetReduceError
from .ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum  # noqa: F401
from .worker.process_sets import (  # noqa: F401  each one a sub-job at the aggregator
    ProcessSet, add_process_set, global_process_set, remove_process_set)

# Horovod code catches this name; netreduce raises NetReduceError (a RuntimeError). Adasum
# is Horovod's name too: using it raises the core's UnsupportedError, which says why.
HorovodInternalError = NetReduceError


def adapter_init(adapter: str, comm: Any = None, process_sets: Any = None,
         refusal: Type[Exception] = InvalidArgumentError) -> None:
    """Each adapter's ``init(comm=None, process_sets=None)``: join the job (rank, size
    and aggregator come from the launcher), then register ``process_sets`` (ProcessSet
    objects or rank lists) as add_process_set on every rank would. ``comm`` (an MPI
    communicator) is refused as ``refusal``, naming ``adapter``."""
    if comm is not None:
        raise refusal(f"{adapter}.init(): comm= (an MPI communicator) is not supported; "
                      "netreduce always spans the launched job")
    _api.init()
    for ps in process_sets or ():
        if ps is not global_process_set:
            add_process_set(ps)


def shutdown() -> None:
    _api.shutdown()


def is_initialized() -> bool:
    return _api.is_initialized()


def rank() -> int:
    return _api.rank()


def size() -> int:
    return _api.size()


def local_rank() -> int:
    return _api.local_rank()


def local_size() -> int:
    return _api.local_size()


def cross_rank() -> int:
    """The host's index, as Horovod numbers hosts (ranks laid out host by host)."""
    return rank() // local_size()


def cross_size() -> int:
    return (size() + local_size() - 1) // local_size()


def is_homogeneous() -> bool:
    return True


# netreduce carries its own data plane: none of Horovod's backends is built in.
def mpi_built() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    return 0


def rocm_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


# Horovod's runtime queries: netreduce runs neither MPI nor Gloo collectives.
def mpi_enabled() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    return False
