"""netreduce.mxnet: MXNet (1.9) on netreduce.

Two ways in:

* KVStore users: ``gluon.Trainer(params, "sgd", ..., kvstore="netreduce")`` or
  ``kvstore=mx.kv.create("netreduce")`` — importing this package registers the store
  (``mxnet.kvstore.KVStoreBase.register``). Its pushpull sums, as ``dist_sync`` does:
  pass the global batch to ``trainer.step``.
* Horovod users: ``import netreduce.mxnet as hvd`` instead of ``import horovod.mxnet
  as hvd`` — same names, arguments and defaults as horovod.mxnet 0.28;
  ``DistributedTrainer`` averages.

This package only hands NDArray memory to the core (buffers.py); negotiation, fusion
and the data plane are ``netreduce`` itself. docs/mxnet.md has the details.
"""
from .compression import Compression  # noqa: F401
from .kvstore import NetReduce, patch_create_kvstore as _patch_create_kvstore
from .mpi_ops import (  # noqa: F401
    Adasum, Average, Max, Min, NetReduceError, ProcessSet, Product, ReduceOp, Sum,
    add_process_set, allgather_object, allreduce, allreduce_, barrier, broadcast,
    broadcast_, broadcast_object, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
    global_process_set, gloo_built, grouped_allreduce, grouped_allreduce_, init,
    is_initialized, local_rank, local_size, mpi_built, mpi_enabled, gloo_enabled,
    mpi_threads_supported, nccl_built, start_timeline, stop_timeline, rank, remove_process_set,
    rocm_built, shutdown, size)
from .scatter_gather import (  # noqa: F401
    allgather, alltoall, grouped_allgather, grouped_reducescatter, reducescatter)
from .trainer import DistributedOptimizer, DistributedTrainer, broadcast_parameters  # noqa: F401
from . import elastic  # noqa: F401  (hvd.elastic: MXNetState, run)

KVStore = NetReduce  # the class behind kvstore="netreduce"
_patch_create_kvstore()
