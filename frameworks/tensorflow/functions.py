"""Variables and Python objects across ranks (horovod.tensorflow.functions)."""
from __future__ import annotations

from typing import Any, List, Optional

import tensorflow as tf

import netreduce as _nr
from netreduce.errors import InvalidArgumentError

from .buffers import broadcast_arrays
from .mpi_ops import (_as_tensor, _check_process_set, default_name,
                      global_process_set, run_numpy, size)


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False,
                        name: Optional[str] = None):
    """Assign root_rank's values to ``variables`` (tf.Variable or Keras Variable) on
    every rank. All of them go to the core as one submission, so they are negotiated
    and fused together. Returns the group of assign ops in a graph, None eagerly."""
    _check_process_set(process_set)
    if not 0 <= int(root_rank) < size():
        raise InvalidArgumentError(f"broadcast_variables: root_rank {root_rank} is outside "
                         f"[0, {size()})")
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    values = [_as_tensor(v) for v in variables]
    label = default_name("broadcast_variables", values, name)
    received = run_numpy(lambda *arrays: broadcast_arrays(arrays, root_rank, label), values,
                         [v.dtype for v in values], [v.shape for v in values],
                         "NetReduceBroadcastVariables")
    assigns = [var.assign(value) for var, value in zip(variables, received)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Overwrite ``variables`` (one or a list) with root_rank's values, in place."""
    _check_process_set(process_set)
    single = not isinstance(variables, (list, tuple))
    items = [variables] if single else list(variables)
    broadcast_variables(items, root_rank, name=name)  # one group for all of them
    return items[0] if single else items


def broadcast_object(obj: Any, root_rank: int = 0, session=None, name: Optional[str] = None,
                     process_set=global_process_set) -> Any:
    """Return root_rank's ``obj`` (anything picklable) on every rank."""
    _check_process_set(process_set)
    return _nr.broadcast_object(obj, root_rank, name=name)


def broadcast_object_fn(root_rank: int = 0, session=None, name: Optional[str] = None,
                        process_set=global_process_set):
    """A function that broadcasts its argument from root_rank (Horovod's helper)."""
    _check_process_set(process_set)
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session=None, name: Optional[str] = None,
                     process_set=global_process_set) -> List[Any]:
    """Every rank's ``obj``, indexed by rank."""
    _check_process_set(process_set)
    return _nr.allgather_object(obj, name=name)
