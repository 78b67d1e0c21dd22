"""netreduce.tensorflow.keras: Keras 3 on netreduce (horovod.tensorflow.keras's names).

    import netreduce.tensorflow.keras as hvd
    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), ...)
    model.fit(x, y, callbacks=[hvd.BroadcastGlobalVariablesCallback(0),
                               hvd.MetricAverageCallback()])
"""
from netreduce.tensorflow import (Adasum, Average, Compression, Max, Min, Product, Sum,  # noqa: F401
                                  allgather_object, broadcast_object, cross_rank,
                                  cross_size, init, is_initialized, local_rank, local_size,
                                  rank, shutdown, size)

from .callbacks import BroadcastGlobalVariablesCallback, MetricAverageCallback  # noqa: F401
from .optimizer import DistributedOptimizer  # noqa: F401
from . import callbacks  # noqa: F401


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
