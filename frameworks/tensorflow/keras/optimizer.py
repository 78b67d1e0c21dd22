"""DistributedOptimizer for Keras 3 (horovod.tensorflow.keras.DistributedOptimizer).

Keras 3 optimizers apply gradients through ``apply(grads, variables)`` — whether called
by ``model.fit``'s train step (inside tf.function) or by a custom loop via
``apply_gradients``. The wrapper is a subclass of the given optimizer's own class whose
``apply`` first all-reduces the whole step's gradients as one group, then hands them to
the original ``apply`` (clipping, loss-scale unscaling, weight decay, EMA unchanged).
"""
from __future__ import annotations

from netreduce.tensorflow.compression import Compression
from netreduce.tensorflow.gradient_tape import allreduce_gradients, check_predivide
from netreduce.tensorflow.mpi_ops import Average, _check_process_set, global_process_set


class _DistributedOptimizer:
    """Mixed in front of the wrapped optimizer's class."""

    def apply(self, grads, trainable_variables=None):
        grads = allreduce_gradients(list(grads), op=self._nr_op,
                                    compression=self._nr_compression,
                                    sparse_as_dense=self._nr_sparse_as_dense,
                                    gradient_predivide_factor=self._nr_predivide,
                                    name=self._nr_name)
        return super().apply(grads, trainable_variables)


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """A copy of ``optimizer`` (same class and config, fresh state) whose updates use
    gradients all-reduced across ranks (Average by default). ``name`` names the
    all-reduce in netreduce (default: derived from the gradients' graph names)."""
    _check_process_set(process_set)
    check_predivide(op, gradient_predivide_factor)
    if backward_passes_per_step != 1:
        raise NotImplementedError(
            "netreduce.tensorflow.keras.DistributedOptimizer: backward_passes_per_step > 1 "
            "is not supported; Keras 3 accumulates locally with the optimizer's own "
            "gradient_accumulation_steps=k (the all-reduce then runs every pass)")
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedOptimizer, base), {})
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._nr_op, wrapped._nr_compression = op, compression
    wrapped._nr_sparse_as_dense = sparse_as_dense
    wrapped._nr_predivide = gradient_predivide_factor
    wrapped._nr_name = name
    return wrapped
