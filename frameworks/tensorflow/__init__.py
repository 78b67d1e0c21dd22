"""netreduce.tensorflow: TensorFlow 2 (Keras 3) on netreduce.

Two ways in:

* Horovod users: ``import netreduce.tensorflow as hvd`` instead of ``import
  horovod.tensorflow as hvd`` — allreduce, grouped_allreduce, broadcast,
  broadcast_variables, allgather, DistributedGradientTape with horovod.tensorflow
  0.28's names, arguments and defaults, eagerly and inside tf.function;
  ``netreduce.tensorflow.keras`` for Keras 3 ``compile``/``fit``.
* tf.distribute users: ``netreduce.tensorflow.Strategy()`` (a MirroredStrategy that
  spans every worker process), or ``tf.distribute.MirroredStrategy(
  cross_device_ops=netreduce.tensorflow.CrossDeviceOps())``.

Only conversion lives here (tensors to numpy buffers and back); negotiation, fusion and
the data plane are the ``netreduce`` core. docs/tensorflow.md has the semantics.
"""
from .compression import Compression  # noqa: F401
from .functions import (allgather_object, broadcast_, broadcast_object,  # noqa: F401
                        broadcast_object_fn, broadcast_variables)
from .gradient_tape import DistributedGradientTape  # noqa: F401
from .mpi_ops import (  # noqa: F401
    Adasum, Average, HorovodInternalError, Max, Min, NetReduceError, Product, ReduceOp, Sum,
    allgather, allreduce, barrier, broadcast, cross_rank, cross_size, cuda_built,
    global_process_set, gloo_built, grouped_allreduce, init, is_homogeneous, is_initialized,
    join, local_rank, local_rank_op, local_size, local_size_op, mpi_built, nccl_built, rank,
    rank_op, rocm_built, shutdown, size, size_op)
from .cross_device_ops import CrossDeviceOps  # noqa: F401
from .strategy import Strategy  # noqa: F401
