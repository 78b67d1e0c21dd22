"""The seam every TensorFlow collective goes through: a call's name and buffers,
then the eager numpy path or one node of the asynchronous graph op (mpi_ops.py's
docstring says how each travels); the process-set checks the calls share.

Below mpi_ops.py, scatter_gather.py and functions.py, which all build on it (and
import nothing of each other's but the public functions)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from netreduce.horovod_queries import is_initialized, size
from netreduce.ops import as_op
from netreduce.worker import process_sets as _ps

from . import buffers, errors

# Process sets (netreduce/worker/process_sets.py): each one a sub-job at the aggregator.
ProcessSet = _ps.ProcessSet
global_process_set = _ps.global_process_set
add_process_set = _ps.add_process_set
remove_process_set = _ps.remove_process_set


def _check_process_set(process_set: Any) -> None:
    if not isinstance(process_set, ProcessSet):
        raise errors.UnsupportedError(
            f"process_set must be a ProcessSet (global_process_set or one from "
            f"add_process_set()), got {type(process_set).__name__}: netreduce supports no "
            "other kind of process set")


def set_size(process_set: Any) -> int:
    return process_set.size()


def set_rank(process_set: Any) -> int:
    return process_set.rank()


def _set_root(root_rank: int, process_set: Any, what: str) -> int:
    """Horovod names a set's broadcast root by its rank in the job. Before init() a
    graph may already be built (as with Horovod): the core checks the root then."""
    if process_set.ranks is None and not is_initialized():
        return int(root_rank)
    if not 0 <= int(root_rank) < size():
        raise errors.InvalidArgumentError(f"{what}: root_rank {root_rank} is outside "
                                          f"[0, {size()})")
    if process_set.ranks is None:
        return int(root_rank)
    if root_rank not in process_set.ranks:
        raise errors.InvalidArgumentError(f"{what}: root_rank {root_rank} is not in "
                                          f"{process_set}")
    return process_set.ranks.index(root_rank)


# --- the seam: eager numpy call or asynchronous graph op ---------------------------------
def _as_tensor(value: Any) -> tf.Tensor:
    if isinstance(value, tf.Tensor):
        return value
    return tf.convert_to_tensor(value)  # tf.Variable, Keras Variable, numpy, Python


def normalize_name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.]", "_", text)


def default_name(kind: str, tensors: Sequence[tf.Tensor], name: Optional[str]) -> Optional[str]:
    """The core's tensor name. Eagerly the user's (or None: the core numbers calls);
    in a graph the user's or one derived from the first input's graph name, made
    unique in the graph (TensorFlow's own rule for node names, so two calls on one
    tensor do not collide)."""
    if tf.executing_eagerly():
        return name
    if name is None:
        suffix = f".x{len(tensors)}" if len(tensors) > 1 else ""
        name = f"{kind}.{normalize_name(tensors[0].name)}{suffix}"
    return normalize_name(tf.compat.v1.get_default_graph().unique_name(name))


def collective(kind: str, tensors: Sequence[tf.Tensor], call: Dict[str, Any],
               splits: Optional[tf.Tensor] = None) -> List[tf.Tensor]:
    """Run one netreduce call now (eager) or add it to the graph as one node."""
    if tf.executing_eagerly():
        arrays = [t.numpy() for t in tensors]
        with errors.convert():
            result = buffers.submit(call, arrays, splits=None if splits is None
                                    else np.asarray(splits)).wait()
        if kind == "alltoall":
            return [tf.convert_to_tensor(result[0], dtype=tensors[0].dtype),
                    tf.convert_to_tensor(result[1], dtype=tf.int32)]
        return [tf.convert_to_tensor(r, dtype=t.dtype) for r, t in zip(result, tensors)]
    from .op_bridge import graph_call
    inputs = list(tensors) + ([splits] if kind == "alltoall" else [])
    return graph_call(kind, inputs, call)


def _reduce(tensors: Sequence[tf.Tensor], name: Optional[str], op: Any, prescale_factor: float,
            postscale_factor: float, kind: str, process_set: Any) -> List[tf.Tensor]:
    op = as_op(op)  # a bad op fails here, at the call, not inside the graph
    for t in tensors:
        if t.dtype == tf.bool:
            raise errors.InvalidArgumentError(
                f"allreduce: tensor {name or t.name!r} has dtype bool, which netreduce cannot "
                "reduce (cast it to an integer type)")
    call = buffers.spec("allreduce", default_name(kind, tensors, name), op, prescale_factor,
                        postscale_factor, process_set_id=process_set.process_set_id)
    return collective("allreduce", tensors, call)


def _reduce_with_grad(tensors: List[tf.Tensor], name: Optional[str], op: Any,
                      prescale_factor: float, postscale_factor: float,
                      kind: str, process_set: Any) -> List[tf.Tensor]:
    """All-reduce whose gradient is the all-reduce of the gradient with the same op and
    scale factors (Horovod's registered gradient), as one group both ways."""

    @tf.custom_gradient
    def reduced(*xs):
        ys = _reduce(xs, name, op, prescale_factor, postscale_factor, kind, process_set)

        def grad(*dys):
            dys = [tf.zeros_like(x) if d is None else d for x, d in zip(xs, dys)]
            return _reduce(dys, None, op, prescale_factor, postscale_factor, kind + ".grad",
                           process_set)
        return ys, grad
    out = reduced(*tensors)
    return [out] if isinstance(out, tf.Tensor) else list(out)


def _broadcast(tensors: Sequence[tf.Tensor], root: int, name: Optional[str], kind: str,
               process_set: Any) -> List[tf.Tensor]:
    call = buffers.spec("broadcast", default_name(kind, tensors, name), root_rank=root,
                        process_set_id=process_set.process_set_id)
    return collective("broadcast", tensors, call)
