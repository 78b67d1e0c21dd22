"""netreduce.tensorflow.keras: Keras 3 on netreduce (horovod.tensorflow.keras's names).

    import netreduce.tensorflow.keras as hvd
    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), ...)
    model.fit(x, y, callbacks=[hvd.BroadcastGlobalVariablesCallback(0),
                               hvd.MetricAverageCallback()])
"""
import keras as _keras

from netreduce.tensorflow import (  # noqa: F401
    Adasum, Average, Compression, Max, Min, ProcessSet, Product, Sum, add_process_set,
    allgather_object, broadcast_object, cross_rank, cross_size, cuda_built, global_process_set,
    gloo_built, init, is_initialized, local_rank, local_size, mpi_built, nccl_built, rank,
    remove_process_set, rocm_built, shutdown, size, ccl_built, ddl_built, mpi_enabled,
    gloo_enabled, mpi_threads_supported)

from .callbacks import (BestModelCheckpoint, BroadcastGlobalVariablesCallback,  # noqa: F401
                        LearningRateScheduleCallback, LearningRateWarmupCallback,
                        MetricAverageCallback)
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer  # noqa: F401
from . import callbacks, elastic  # noqa: F401


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """All-reduce a tensor-compatible value (Average by default)."""
    from netreduce.tensorflow import allreduce as _allreduce
    return _allreduce(value, average=average, name=name, op=op,
                      prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      compression=compression)


def allgather(value, name=None):
    from netreduce.tensorflow import allgather as _allgather
    return _allgather(value, name=name)


def broadcast(value, root_rank, name=None):
    from netreduce.tensorflow import broadcast as _broadcast
    return _broadcast(value, root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    from netreduce.tensorflow import reducescatter as _reducescatter
    return _reducescatter(value, name=name, op=op)


def broadcast_global_variables(root_rank):
    """TF1 graphs only, as in Horovod (Keras 3 models: BroadcastGlobalVariablesCallback
    or netreduce.tensorflow.broadcast_variables(model.variables, root_rank))."""
    from netreduce.tensorflow import broadcast_global_variables as _bgv
    return _bgv(root_rank)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """keras.models.load_model whose optimizer comes back distributed, with its saved
    state (iterations, slots): every keras.optimizers class, and ``custom_optimizers``,
    is deserialized as its DistributedOptimizer subclass."""
    from .optimizer import distributed_class
    classes = [c for c in vars(_keras.optimizers).values()
               if isinstance(c, type) and issubclass(c, _keras.optimizers.Optimizer)]
    classes += list(custom_optimizers or [])
    objects = {c.__name__: distributed_class(c, {"compression": compression}) for c in classes}
    objects.update(custom_objects or {})
    return _keras.models.load_model(filepath, custom_objects=objects)
