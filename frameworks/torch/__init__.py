"""netreduce.torch: PyTorch on netreduce.

Two ways in, each a one-line change:

* Horovod users: ``import netreduce.torch as hvd`` instead of ``import horovod.torch as
  hvd`` — same names, arguments, defaults and error types as horovod.torch 0.28.
* torch.distributed users: ``dist.init_process_group("netreduce")`` instead of
  ``"gloo"`` — importing this package registers the backend — or keep gloo and
  ``ddp_model.register_comm_hook(None, netreduce.torch.allreduce_hook)``.

This package only converts tensors to numpy buffers and handles to futures; the
communicator (negotiation, fusion, data plane) is ``netreduce`` itself.
"""
import torch.distributed as _dist

from .compression import Compression  # noqa: F401
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,  # noqa: F401
                        broadcast_parameters)
from .mpi_ops import (  # noqa: F401
    Adasum, Average, HorovodInternalError, Max, Min, NetReduceError, Product, ReduceOp, Sum,
    allreduce, allreduce_, allreduce_async, allreduce_async_,
    barrier, broadcast, broadcast_, broadcast_async, broadcast_async_, cross_rank, cross_size,
    ProcessSet, add_process_set, remove_process_set,
    ccl_built, cuda_built, ddl_built, global_process_set, gloo_built, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, init, is_homogeneous, is_initialized,
    join, local_rank, local_size, mpi_built, mpi_enabled, gloo_enabled, mpi_threads_supported,
    nccl_built, start_timeline, stop_timeline, poll, rank, rocm_built, shutdown, size,
    synchronize)
from .scatter_gather import (  # noqa: F401
    allgather, allgather_async, alltoall, alltoall_async, grouped_allgather, grouped_allgather_async,
    grouped_reducescatter, grouped_reducescatter_async, reducescatter, reducescatter_async,
    sparse_allreduce_async)
from .optimizer import DistributedOptimizer  # noqa: F401
from . import elastic  # noqa: F401  (hvd.elastic: TorchState, ElasticSampler, run)

if _dist.is_available():  # torch builds without distributed support lack both seams
    from .ddp_hook import allreduce_hook, ddp_overlap  # noqa: F401
    from .process_group import ProcessGroupNetReduce, register as _register_backend  # noqa: F401
    _register_backend()
