"""horovod.tensorflow.elastic: states of TensorFlow variables and Keras models, and
``run``. The loop is the core's (netreduce/elastic.py): under an elastic netreduce-run
the job shrinks and grows — after a reset ``rank()``/``size()`` are the new ones and
the state is synced from the new rank 0 — elsewhere it recovers at a fixed size from
a job that broke under every rank. Graph ops read the job's size when they run, so
a traced tf.function stays right across a resize; a value the program computed from
``size()`` itself (a learning rate) belongs in a reset callback."""
from __future__ import annotations

from typing import Any, Callable, List

import numpy as np
import tensorflow as tf

from netreduce import elastic as _elastic
from netreduce.elastic import HostsUpdatedInterrupt, ObjectState, State  # noqa: F401
from netreduce.errors import DataPlaneError

from . import errors
from .functions import broadcast_object, broadcast_variables
from .mpi_ops import rank

# Graph ops fail with a TensorFlow status, not a Python netreduce error: the codes
# the recoverable errors carry (errors.py), for nodes of netreduce's ops.
_RECOVERABLE_CODES = (tf.errors.UNKNOWN, tf.errors.DEADLINE_EXCEEDED, tf.errors.ABORTED,
                      tf.errors.UNAVAILABLE)


def _graph_failure(exc: tf.errors.OpError) -> bool:
    return exc.error_code in _RECOVERABLE_CODES and "Netreduce" in (exc.message or "")


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``func(state, ...)``; when a collective fails because the job broke, roll
    ``state`` back to its last commit; when hosts change, stop at the commit; then
    rejoin the job (at its new size under an elastic netreduce-run), sync from rank 0,
    run again (Horovod's decorator; netreduce/elastic.py says what is recoverable)."""

    def graph_errors_as_core(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as exc:
            if isinstance(exc, _elastic.RECOVERABLE) or not _graph_failure(exc):
                raise
            raise DataPlaneError(f"a netreduce graph op failed: {exc.message}") from exc
    return _elastic.run_fn(graph_errors_as_core)


def _values(variables) -> List[np.ndarray]:
    return [np.array(v.numpy(), copy=True) for v in variables]


class _ModelState(ObjectState):
    """An ObjectState whose commit and rollback also save and load a model's
    values (``_save_model`` / ``_load_model``, per kind of model)."""

    def _save_model(self) -> None:
        raise NotImplementedError

    def _load_model(self) -> None:
        raise NotImplementedError

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load_model()
        super().restore()


class TensorFlowState(_ModelState):
    """A list of tf.Variables (default: the TF1 global variables) plus any Python
    values as keyword arguments. Eagerly, or in a TF1 graph with ``session``."""

    def __init__(self, variables=None, session=None, **kwargs: Any) -> None:
        self.variables = list(variables if variables is not None
                              else tf.compat.v1.global_variables())
        self.session = session or (None if tf.executing_eagerly()
                                   else tf.compat.v1.get_default_session())
        self._bcast_op = None if tf.executing_eagerly() else \
            broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def sync(self) -> None:
        if self._bcast_op is None:
            broadcast_variables(self.variables, root_rank=0)
        else:
            self.session.run(self._bcast_op)
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        if self.session is not None:
            self._saved = self.session.run(self.variables)
        else:
            self._saved = _values(self.variables)

    def _load_model(self) -> None:
        for var, value in zip(self.variables, self._saved):
            if self.session is not None:
                var.load(value, self.session)
            else:
                var.assign(value)


class TensorFlowKerasState(_ModelState):
    """A Keras 3 model and its optimizer (the model's own if not given) plus any
    Python values as keyword arguments (``epoch``, ``batch``...)."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs: Any) -> None:
        if not getattr(model, "built", True):
            raise errors.InvalidArgumentError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _optimizer_variables(self) -> list:
        return list(self.optimizer.variables) if self.optimizer is not None else []

    def sync(self) -> None:
        broadcast_variables(list(self.model.variables) + self._optimizer_variables(),
                            root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._saved_model = _values(self.model.variables)
        self._saved_optimizer = _values(self._optimizer_variables())

    def _load_model(self) -> None:
        for var, value in zip(self.model.variables, self._saved_model):
            var.assign(value)
        # an optimizer built after the last save (its first step) has no saved state:
        # its variables keep what they hold
        for var, value in zip(self._optimizer_variables(), self._saved_optimizer):
            var.assign(value)


__all__ = ["TensorFlowKerasState", "TensorFlowState", "run", "ObjectState", "State",
           "HostsUpdatedInterrupt"]
