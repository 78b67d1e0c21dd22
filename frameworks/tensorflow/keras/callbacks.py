"""Keras 3 callbacks (horovod.tensorflow.keras.callbacks)."""
from __future__ import annotations

import numbers

import keras
import numpy as np

from netreduce.tensorflow.functions import broadcast_variables
from netreduce.tensorflow.buffers import reduce_arrays
from netreduce.tensorflow.mpi_ops import Average


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Make every rank start from root_rank's model and optimizer variables.

    Keras 3 builds the model and the optimizer before ``on_train_begin``, so the
    broadcast happens there — before the first step, where Horovod (Keras 2) had to wait
    for the end of the first batch; if the optimizer is not built yet at that point, the
    end of the first batch broadcasts again."""

    def __init__(self, root_rank, device='', local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self._local = {id(v) for v in (local_variables or [])}
        self.broadcast_done = False

    def register_local_var(self, var):
        self._local.add(id(var))

    def _broadcast(self) -> bool:
        shared = [v for v in self.model.variables if id(v) not in self._local]
        optimizer = getattr(self.model, "optimizer", None)
        opt_vars = list(optimizer.variables) if optimizer is not None else []
        broadcast_variables(shared + opt_vars, root_rank=self.root_rank)
        return optimizer is None or bool(opt_vars)

    def on_train_begin(self, logs=None):
        if not self.broadcast_done:
            self.broadcast_done = self._broadcast()

    def on_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()
            self.broadcast_done = True


def _is_number(value) -> bool:
    if isinstance(value, numbers.Number):
        return not isinstance(value, bool)
    array = np.asarray(value)  # numpy scalars, 0-d tensors
    return array.ndim == 0 and array.dtype.kind in "iuf"


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's metrics (``logs``) over ranks at the end of every epoch, in
    one grouped all-reduce, so that every rank's callbacks after this one (checkpoint,
    ReduceLROnPlateau, early stopping) see the same numbers. Put it first."""

    def __init__(self, device=''):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        if not keys:
            return
        values = [np.asarray(float(logs[k]), dtype=np.float64) for k in keys]
        for key, value in zip(keys, reduce_arrays(values, None, Average)):
            logs[key] = float(value)
