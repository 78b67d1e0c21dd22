"""Variables and Python objects across ranks (horovod.tensorflow.functions)."""
from __future__ import annotations

from typing import Any, List, Optional

import tensorflow as tf

import netreduce as _nr
from netreduce.worker import process_sets as _ps

from . import errors
from .seam import (_as_tensor, _broadcast, _check_process_set, _set_root,
                   global_process_set)


def assign_broadcast(variables, root_rank, name: Optional[str], process_set) -> Any:
    """Assign root_rank's values to ``variables``, all of them one core submission
    (negotiated and fused together). Returns the group of assign ops in a graph
    (running it performs the broadcast), None eagerly."""
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    root = _set_root(root_rank, process_set, "broadcast_variables")
    values = [_as_tensor(v) for v in variables]
    received = _broadcast(values, root, name, "broadcast_variables", process_set)
    assigns = [var.assign(value) for var, value in zip(variables, received)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False,
                        name: Optional[str] = None):
    """Assign root_rank's values to ``variables`` (tf.Variable or Keras Variable) on
    every rank. Returns the group of assign ops in a graph, None eagerly."""
    _check_process_set(process_set)
    return assign_broadcast(variables, root_rank, name, process_set)


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Overwrite ``variables`` (one or a list) with root_rank's values, in place, as
    one submission. Returns their updated values (in a graph: reads that run after
    the assignment, so fetching them performs it, as Horovod's do)."""
    _check_process_set(process_set)
    single = not isinstance(variables, (list, tuple))
    items = [variables] if single else list(variables)
    assign = assign_broadcast(items, root_rank, name, process_set)
    if tf.executing_eagerly():
        values = [tf.convert_to_tensor(v) for v in items]
    else:
        with tf.control_dependencies([assign]):
            values = [tf.identity(v.read_value() if hasattr(v, "read_value") else v)
                      for v in items]
    return values[0] if single else values


def broadcast_global_variables(root_rank: int):
    """Horovod's TF1 helper: the op that assigns root_rank's value to every global
    variable (``tf.compat.v1.global_variables()``); graph mode only, as in Horovod."""
    if tf.executing_eagerly():
        raise errors.UnsupportedError(  # a RuntimeError, as Horovod's
            "hvd.broadcast_global_variables() does not support eager execution. Please use "
            "`hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object(obj: Any, root_rank: int = 0, session=None, name: Optional[str] = None,
                     process_set=global_process_set) -> Any:
    """Return root_rank's ``obj`` (anything picklable) on every rank."""
    _check_process_set(process_set)
    root = _set_root(root_rank, process_set, "broadcast_object")
    with _ps.using(process_set), errors.convert():
        return _nr.broadcast_object(obj, root, name=name)


def broadcast_object_fn(root_rank: int = 0, session=None, name: Optional[str] = None,
                        process_set=global_process_set):
    """A function that broadcasts its argument from root_rank (Horovod's helper)."""
    _check_process_set(process_set)
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session=None, name: Optional[str] = None,
                     process_set=global_process_set) -> List[Any]:
    """Every rank's ``obj``, indexed by rank (of the process set)."""
    _check_process_set(process_set)
    with _ps.using(process_set), errors.convert():
        return _nr.allgather_object(obj, name=name)


# Plain Python that builds ops: AutoGraph must not rewrite it inside tf.function.
for _name in ('assign_broadcast', 'broadcast_variables', 'broadcast_global_variables'):
    globals()[_name] = tf.autograph.experimental.do_not_convert(globals()[_name])
