"""horovod.tensorflow.DistributedOptimizer: a tf.compat.v1.train.Optimizer (TF1 graphs,
``minimize`` in a Session) whose gradients are all-reduced before they are applied.
A Keras optimizer goes to netreduce.tensorflow.keras.DistributedOptimizer instead."""
from __future__ import annotations

import tensorflow as tf

from . import errors
from .compression import Compression
from .gradient_tape import allreduce_gradients, check_predivide
from .mpi_ops import Average, _check_process_set, global_process_set


class _DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """Delegates to the wrapped optimizer; compute_gradients all-reduces (one grouped
    submission per fusion buffer, as DistributedGradientTape)."""

    def __init__(self, optimizer, name, use_locking, settings):
        self._optimizer = optimizer
        self._nr = settings
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}",
                         use_locking=use_locking)

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = allreduce_gradients([g for g, _ in pairs], **self._nr)
        return list(zip(grads, [v for _, v in pairs]))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense='',
                         device_sparse='', compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wrap a tf.compat.v1 optimizer (or, as Horovod does, hand a Keras optimizer to
    the Keras wrapper) so that its gradients are all-reduced across ranks."""
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from .keras import DistributedOptimizer as keras_distributed
        return keras_distributed(optimizer, name=name, compression=compression,
                                 sparse_as_dense=sparse_as_dense,
                                 gradient_predivide_factor=gradient_predivide_factor, op=op,
                                 backward_passes_per_step=backward_passes_per_step,
                                 process_set=process_set,
                                 scale_local_gradients=scale_local_gradients)
    _check_process_set(process_set)
    check_predivide(op, gradient_predivide_factor)
    if backward_passes_per_step != 1:
        raise errors.UnsupportedError(
            "netreduce.tensorflow.DistributedOptimizer: backward_passes_per_step > 1 is not "
            "supported; accumulate the gradients of k passes yourself, then minimize once")
    return _DistributedOptimizerV1(optimizer, name, use_locking, dict(
        op=op, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, process_set=process_set))
