"""The process queries of Horovod's API (``hvd.rank()``, ``hvd.cross_size()``,
``hvd.nccl_built()``, ...), the same for every framework adapter, which re-export
them. Only ``cuda_built`` differs per framework and stays in each adapter."""
from __future__ import annotations

from . import api as _api


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
