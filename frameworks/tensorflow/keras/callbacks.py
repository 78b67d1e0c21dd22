"""Keras 3 callbacks (horovod.tensorflow.keras.callbacks)."""
from __future__ import annotations

import numbers

import keras
import numpy as np

from netreduce.tensorflow.functions import broadcast_variables
from netreduce.tensorflow import buffers, errors
from netreduce.tensorflow.mpi_ops import Average, rank, size


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
        with errors.convert():
            averaged = buffers.allreduce(values, None, Average).wait()
        for key, value in zip(keys, averaged):
            logs[key] = float(value)


def _value(variable) -> float:
    return float(variable.numpy() if hasattr(variable, "numpy") else variable)


def _lr(optimizer) -> float:
    return _value(optimizer.learning_rate)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the optimizer's learning rate to ``initial_lr * multiplier(epoch)`` for the
    epochs in [start_epoch, end_epoch) (horovod.tensorflow.keras's). ``multiplier`` is a
    constant (exponential decay: multiplier ** (epoch - start_epoch)) or a function; with
    ``staircase=False`` it is called at every batch with a fractional epoch
    (epoch + batch / steps_per_epoch).

    Keras 3 keeps the learning rate in a variable, so the new value reaches the
    compiled train step. Momentum correction (scaling the momentum by new_lr / old_lr
    for the one batch) applies only to an optimizer whose momentum is a variable:
    Keras 3's SGD holds a Python float, read once when the train step is traced."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise errors.InvalidArgumentError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self._restore_momentum = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _steps(self) -> int:
        steps = (self.params or {}).get("steps")
        if steps:
            return int(steps)
        raise errors.InvalidArgumentError(f"Could not autodetect the number of steps per epoch; pass "
                         f"steps_per_epoch to {type(self).__name__}()")

    def _adjust(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old = _lr(optimizer)
        new = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate.assign(new)
        momentum = getattr(optimizer, "momentum", None)
        if self.momentum_correction and hasattr(momentum, "assign") and old:
            self._restore_momentum = _value(momentum)
            momentum.assign(self._restore_momentum * new / old)

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._steps()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or \
                (self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self._restore_momentum is not None:
            self.model.optimizer.momentum.assign(self._restore_momentum)
            self._restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warmup from ``initial_lr / size`` to ``initial_lr`` over
    ``warmup_epochs`` (Goyal et al., "Accurate, Large Minibatch SGD"), adjusted every
    batch: lr(epoch) = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # the end of each epoch lands on round numbers (TensorBoard's lr curve)
            epoch += 1.0 / self.steps_per_epoch
            n = size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_lr(self.model.optimizer):g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """ModelCheckpoint that keeps the best model only (Horovod's). Keras 3 needs a
    path; Horovod's default of none becomes ``best.keras`` (``best.weights.h5`` for
    weights only). Save on one rank only: ``callbacks=[...] + ([BestModelCheckpoint()]
    if hvd.rank() == 0 else [])``."""

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                 save_freq="epoch", filepath=None):
        if filepath is None:
            filepath = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)
