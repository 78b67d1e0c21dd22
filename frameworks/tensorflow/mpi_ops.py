"""Tensor collectives with horovod.tensorflow 0.28's names, arguments and defaults.

How a TensorFlow value reaches the core, and back:

* eagerly, ``tensor.numpy()`` (on CPU a view of the tensor's buffer) goes to the
  netreduce core and the result array comes back through ``tf.convert_to_tensor``;
* inside ``tf.function`` (Keras ``fit`` included) the very same Python body becomes one
  ``tf.numpy_function`` node. No custom op is compiled: the cost is one Python call per
  node (a few tens of µs holding the GIL) and one copy of each result into a TF tensor,
  while the transfer itself runs in the core's threads with the GIL released. The node
  is stateful, so tf.function's automatic control dependencies run netreduce nodes in
  program order on every rank; a blocked node therefore never waits for one that a
  busy TF thread pool has not started yet.
* grouped_allreduce makes a list of tensors one node and one core submission, so
  negotiation and fusion see them together (DistributedGradientTape and the Keras
  optimizer cut a step's gradients at the fusion buffer size: gradient_tape.py).

Names: eager calls without ``name=`` use the core's per-call counter (every rank calls
in the same order); in a graph the name is derived at trace time from the input tensor's
graph name (as Horovod does), which is the same on every rank that traced the same code.
Errors: eagerly the core's NetReduceError propagates as is; in a graph TensorFlow wraps
it in ``tf.errors.UnknownError`` whose message carries the netreduce message.
"""
from __future__ import annotations

import re
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from netreduce.horovod_args import handle_average_backwards_compatibility  # noqa: F401
import netreduce as _nr
from netreduce.horovod_queries import (  # noqa: F401  Horovod's process queries
    shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank,
    cross_size, is_homogeneous, mpi_built, gloo_built, nccl_built, rocm_built)
from netreduce.ops import as_op
from netreduce.errors import InvalidArgumentError

from .buffers import allgather_array, broadcast_arrays, reduce_arrays
from .compression import Compression

Average, Sum, Min, Max = _nr.Average, _nr.Sum, _nr.Min, _nr.Max
Adasum, Product = _nr.Adasum, _nr.Product  # Adasum is refused by the core with the reason
ReduceOp = _nr.ReduceOp
NetReduceError = _nr.NetReduceError
HorovodInternalError = NetReduceError  # the name Horovod code catches


class _ProcessSet:
    """Horovod 0.28 takes ``process_set=``; netreduce has one: the whole job."""
    process_set_id = 0

    def included(self) -> bool:
        return True

    def size(self) -> int:
        return size()

    def rank(self) -> int:
        return rank()

    def __repr__(self) -> str:
        return "global_process_set"


global_process_set = _ProcessSet()


def _check_process_set(process_set: Any) -> None:
    if process_set is not global_process_set:
        raise NotImplementedError("netreduce supports only the global process set")


# --- lifecycle -------------------------------------------------------------------------
def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (rank, size and aggregator come from the launcher)."""
    if comm is not None:
        raise InvalidArgumentError("netreduce.tensorflow.init(): comm= (an MPI communicator) is not "
                         "supported; netreduce always spans the launched job")
    if process_sets not in (None, [], [global_process_set]):
        raise NotImplementedError("netreduce.tensorflow.init(): only the global process "
                                  "set is supported")
    _nr.init()


def cuda_built() -> bool:
    return False


# --- the graph seam ----------------------------------------------------------------------
def _as_tensor(value: Any) -> tf.Tensor:
    if isinstance(value, tf.Tensor):
        return value
    return tf.convert_to_tensor(value)  # tf.Variable, Keras Variable, numpy, Python


def normalize_name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.]", "_", text)


def default_name(kind: str, tensors: Sequence[tf.Tensor], name: Optional[str]) -> Optional[str]:
    """The core's tensor name: the user's, else (in a graph) one derived from the first
    input's graph name; None eagerly (the core numbers calls)."""
    if name is not None or tf.executing_eagerly():
        return name
    suffix = f".x{len(tensors)}" if len(tensors) > 1 else ""
    return f"{kind}.{normalize_name(tensors[0].name)}{suffix}"


def run_numpy(fn: Callable[..., List[np.ndarray]], inputs: Sequence[tf.Tensor],
              out_dtypes: Sequence[tf.DType], out_shapes: Sequence[Any],
              op_name: str) -> List[tf.Tensor]:
    """Run ``fn`` (numpy arrays in, list of arrays out) now if eager, else as one
    stateful numpy_function node with the given static output shapes."""
    if tf.executing_eagerly():
        results = fn(*[t.numpy() for t in inputs])
        return [tf.convert_to_tensor(r, dtype=d) for r, d in zip(results, out_dtypes)]
    outs = tf.numpy_function(fn, list(inputs), list(out_dtypes), stateful=True, name=op_name)
    outs = [outs] if isinstance(outs, tf.Tensor) else list(outs)
    for out, shape in zip(outs, out_shapes):
        out.set_shape(shape)
    return outs


def _reduce_tensors(tensors: Sequence[tf.Tensor], name: Optional[str], op: Any,
                    prescale_factor: float, postscale_factor: float,
                    kind: str) -> List[tf.Tensor]:
    label = default_name(kind, tensors, name)
    op = as_op(op)  # a bad op fails here, at the call, not inside the graph

    def body(*arrays):
        return reduce_arrays(arrays, label, op, prescale_factor, postscale_factor)
    return run_numpy(body, tensors, [t.dtype for t in tensors], [t.shape for t in tensors],
                     "NetReduceAllreduce")


def _reduce_with_grad(tensors: List[tf.Tensor], name: Optional[str], op: Any,
                      prescale_factor: float, postscale_factor: float,
                      kind: str) -> List[tf.Tensor]:
    """All-reduce whose gradient is the all-reduce of the gradient with the same op and
    scale factors (Horovod's registered gradient), as one group both ways."""

    @tf.custom_gradient
    def reduced(*xs):
        ys = _reduce_tensors(xs, name, op, prescale_factor, postscale_factor, kind)

        def grad(*dys):
            dys = [tf.zeros_like(x) if d is None else d for x, d in zip(xs, dys)]
            return _reduce_tensors(dys, None, op, prescale_factor, postscale_factor,
                                   kind + ".grad")
        return ys, grad
    out = reduced(*tensors)
    return [out] if isinstance(out, tf.Tensor) else list(out)


# --- public collectives ------------------------------------------------------------------
def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """All-reduce a tf.Tensor, tf.Variable or tf.IndexedSlices across ranks
    (differentiable). IndexedSlices are all-gathered (values and indices), as in
    Horovod: only the rows a rank touched travel."""
    _check_process_set(process_set)
    op = as_op(handle_average_backwards_compatibility(op, average))
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_indexed_slices(tensor, op, prescale_factor, postscale_factor, name)
    tensor = _as_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _reduce_with_grad([compressed], name, op, prescale_factor, postscale_factor,
                                "allreduce")[0]
    return compression.decompress(reduced, ctx)


def _allreduce_indexed_slices(slices, op, prescale_factor, postscale_factor, name):
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
    base = default_name("allreduce.sparse", [slices.values], name)
    values = allgather(slices.values, name=None if base is None else f"{base}.values")
    indices = allgather(slices.indices, name=None if base is None else f"{base}.indices")
    if op is Average:
        values = values / tf.cast(size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """All-reduce a list of tensors as one core submission (differentiable); the
    tf.IndexedSlices among them are all-gathered."""
    if not tensors:
        return tensors
    _check_process_set(process_set)
    op = as_op(handle_average_backwards_compatibility(op, average))
    tensors = list(tensors)
    out: List[Any] = [None] * len(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    for i, t in enumerate(tensors):
        if i not in dense:
            out[i] = _allreduce_indexed_slices(t, op, prescale_factor, postscale_factor,
                                               None if name is None else f"{name}.sparse{i}")
    if dense:
        pairs = [compression.compress(_as_tensor(tensors[i])) for i in dense]
        reduced = _reduce_with_grad([p[0] for p in pairs], name, op, prescale_factor,
                                    postscale_factor, "grouped_allreduce")
        for i, r, (_, ctx) in zip(dense, reduced, pairs):
            out[i] = compression.decompress(r, ctx)
    return out


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """root_rank's ``tensor`` on every rank (differentiable: the gradient is the
    averaged gradient on the root and zero elsewhere, as in Horovod)."""
    _check_process_set(process_set)
    if not 0 <= int(root_rank) < size():
        raise InvalidArgumentError(f"broadcast: root_rank {root_rank} is outside [0, {size()})")
    tensor = _as_tensor(tensor)

    @tf.custom_gradient
    def bcast(x):
        label = default_name("broadcast", [x], name)
        y = run_numpy(lambda a: broadcast_arrays([a], root_rank, label), [x], [x.dtype],
                      [x.shape], "NetReduceBroadcast")[0]

        def grad(dy):
            reduced = _reduce_tensors([dy], None, Average, 1.0, 1.0, "broadcast.grad")[0]
            return reduced if rank() == root_rank else reduced * 0
        return y, grad
    return bcast(tensor)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's ``tensor`` along the first dimension (the first
    dimension may differ between ranks)."""
    _check_process_set(process_set)
    tensor = _as_tensor(tensor)
    label = default_name("allgather", [tensor], name)
    shape = tensor.shape
    out_shape = tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else [None]
    return run_numpy(lambda a: [allgather_array(a, label)], [tensor], [tensor.dtype],
                     [out_shape], "NetReduceAllgather")[0]


def barrier(process_set=global_process_set) -> None:
    _check_process_set(process_set)
    _nr.barrier()


def join() -> int:
    return int(_nr.join())


def size_op(process_set_id=0, name=None):
    return tf.constant(size(), dtype=tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(local_size(), dtype=tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(rank(), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(local_rank(), dtype=tf.int32, name=name)
