"""netreduce.tensorflow: TensorFlow 2 (Keras 3) on netreduce.

Two ways in:

* Horovod users: ``import netreduce.tensorflow as hvd`` instead of ``import
  horovod.tensorflow as hvd`` — allreduce, grouped_allreduce, broadcast(_),
  broadcast_variables, allgather, alltoall, reducescatter (and their grouped forms),
  process sets, DistributedGradientTape, elastic, with horovod.tensorflow 0.28's
  names, arguments, defaults, gradients and error types, eagerly, inside
  tf.function and in TF1 sessions (an asynchronous custom op: op_bridge.py);
  ``netreduce.tensorflow.keras`` for Keras 3 ``compile``/``fit``.
* tf.distribute users: ``netreduce.tensorflow.Strategy()`` (a MirroredStrategy that
  spans every worker process), or ``tf.distribute.MirroredStrategy(
  cross_device_ops=netreduce.tensorflow.CrossDeviceOps())``.

Only conversion lives here (tensors to numpy buffers and back); negotiation, fusion and
the data plane are the ``netreduce`` core. docs/tensorflow.md has the semantics.
"""
from .compression import Compression  # noqa: F401
from .functions import (allgather_object, broadcast_global_variables,  # noqa: F401
                        broadcast_object, broadcast_object_fn, broadcast_variables)
from .gradient_tape import (DistributedGradientTape,  # noqa: F401
                            PartialDistributedGradientTape)
from .mpi_ops import (  # noqa: F401
    Adasum, Average, HorovodInternalError, Max, Min, NetReduceError, Product, ProcessSet,
    ReduceOp, Sum, _executing_eagerly, add_process_set, allreduce, barrier, broadcast,
    broadcast_, cross_rank, cross_size, cuda_built, global_process_set, gloo_built,
    grouped_allreduce, init, is_homogeneous, is_initialized, join, local_rank, local_rank_op,
    local_size, local_size_op, mpi_built, nccl_built, process_set_included_op, rank, rank_op,
    remove_process_set, rocm_built, shutdown, size, size_op, ccl_built, ddl_built, mpi_enabled,
    gloo_enabled, mpi_threads_supported)
from .scatter_gather import (allgather, alltoall, grouped_allgather,  # noqa: F401
                             grouped_reducescatter, reducescatter)
from .optimizer import DistributedOptimizer  # noqa: F401
from .sync_batch_norm import SyncBatchNormalization  # noqa: F401
from .cross_device_ops import CrossDeviceOps  # noqa: F401
from .strategy import Strategy  # noqa: F401
from . import elastic  # noqa: F401
