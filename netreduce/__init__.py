"""netreduce: in-network aggregation all-reduce for distributed DNN training.

    import netreduce as nr
    nr.init()
    avg = nr.allreduce(grad)                 # Average over all ranks, via the aggregator
    h = nr.allreduce_async(grad, name="w")   # ... nr.synchronize(h)
    nr.shutdown()
"""
from netreduce._version import __version__  # noqa: F401

from netreduce import _source_tree

_source_tree.install()  # a checkout imported without being built says so (_source_tree.py)

from netreduce.errors import NetReduceError  # noqa: F401
from netreduce.ops import (Adasum, Average, Max, Min, Product, ReduceOp,  # noqa: F401
                           Sum)
from netreduce.api import (allgather_object, allreduce, allreduce_,  # noqa: F401
                           allreduce_async, barrier, broadcast, broadcast_,
                           broadcast_async, broadcast_object, grouped_allreduce,
                           grouped_allreduce_, grouped_allreduce_async, init,
                           is_initialized, join, local_rank, local_size, poll, rank, shutdown,
                           size, start_timeline, stop_timeline, synchronize)
from netreduce.alltoall import alltoall, alltoall_async  # noqa: F401
from netreduce.worker.handle import Handle  # noqa: F401

__all__ = [
    "__version__", "NetReduceError", "ReduceOp", "Average", "Sum", "Min", "Max",
    "Product", "Adasum", "Handle", "init", "shutdown", "is_initialized", "rank", "size",
    "local_rank", "local_size", "allreduce", "allreduce_", "allreduce_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_object", "allgather_object", "alltoall",
    "alltoall_async", "barrier", "join", "poll", "synchronize", "start_timeline",
    "stop_timeline",
]
