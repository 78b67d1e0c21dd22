"""DistributedOptimizer for Keras 3 (horovod.tensorflow.keras.DistributedOptimizer).

Keras 3 optimizers apply gradients through ``apply(grads, variables)`` — whether called
by ``model.fit``'s train step (inside tf.function) or by a custom loop via
``apply_gradients``. The wrapper is a subclass of the given optimizer's own class whose
``apply`` first all-reduces the whole step's gradients as one group, then hands them to
the original ``apply`` (clipping, loss-scale unscaling, weight decay, EMA unchanged).
The subclass carries its settings as class attributes, so an instance Keras builds
itself (``from_config``, ``load_model``) is distributed too.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import tensorflow as tf

from netreduce.tensorflow import errors
from netreduce.tensorflow.compression import Compression
from netreduce.tensorflow.gradient_tape import allreduce_gradients, check_predivide
from netreduce.tensorflow.mpi_ops import Average, _check_process_set, global_process_set, size


class _DistributedOptimizer:
    """Mixed in front of the wrapped optimizer's class."""

    _nr_op: Any = Average
    _nr_compression: Any = Compression.none
    _nr_sparse_as_dense = False
    _nr_predivide = 1.0
    _nr_name: Optional[str] = None
    _nr_process_set: Any = global_process_set
    _nr_scale_local = True

    def register_local_var(self, var) -> None:
        """``var``'s gradient stays local (scaled by 1/size with scale_local_gradients)."""
        if "_nr_local" not in self.__dict__:
            self._nr_local = set()
        self._nr_local.add(id(var))

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        variables = list(trainable_variables) if trainable_variables is not None \
            else list(self._trainable_variables)
        local = self.__dict__.get("_nr_local", set())
        shared = [i for i, v in enumerate(variables) if id(v) not in local]
        reduced = allreduce_gradients([grads[i] for i in shared], op=self._nr_op,
                                      compression=self._nr_compression,
                                      sparse_as_dense=self._nr_sparse_as_dense,
                                      gradient_predivide_factor=self._nr_predivide,
                                      name=self._nr_name, process_set=self._nr_process_set)
        for i, g in zip(shared, reduced):
            grads[i] = g
        if local and self._nr_scale_local:
            n = float(size())
            for i, v in enumerate(variables):
                g = grads[i]
                if id(v) in local and g is not None:
                    grads[i] = (tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                                if isinstance(g, tf.IndexedSlices) else g / n)
        return super().apply(grads, trainable_variables)


def distributed_class(base: type, settings: Dict[str, Any]) -> type:
    """``base`` (a Keras optimizer class) whose apply all-reduces first."""
    attrs = {f"_nr_{k}": v for k, v in settings.items()}
    return type(base.__name__, (_DistributedOptimizer, base), attrs)


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
        raise errors.UnsupportedError(
            "netreduce.tensorflow.keras.DistributedOptimizer: backward_passes_per_step > 1 "
            "is not supported; Keras 3 accumulates locally with the optimizer's own "
            "gradient_accumulation_steps=k (the all-reduce then runs every pass)")
    if isinstance(optimizer, _DistributedOptimizer):
        return optimizer
    cls = distributed_class(optimizer.__class__, {
        "op": op, "compression": compression, "sparse_as_dense": sparse_as_dense,
        "predivide": gradient_predivide_factor, "name": name, "process_set": process_set,
        "scale_local": scale_local_gradients})
    return cls.from_config(optimizer.get_config())


def PartialDistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set,
                                local_layers=None, scale_local_gradients=True):
    """DistributedOptimizer whose ``local_layers``' variables keep their own gradients
    (Horovod's: scaled by 1/size with scale_local_gradients)."""
    wrapped = DistributedOptimizer(optimizer, name=name, compression=compression,
                                   sparse_as_dense=sparse_as_dense,
                                   gradient_predivide_factor=gradient_predivide_factor, op=op,
                                   backward_passes_per_step=backward_passes_per_step,
                                   groups=groups, process_set=process_set,
                                   scale_local_gradients=scale_local_gradients)
    for layer in local_layers or []:
        for var in layer.trainable_weights:
            wrapped.register_local_var(var)
    return wrapped
