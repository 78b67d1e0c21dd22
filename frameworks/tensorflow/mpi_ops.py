"""Tensor collectives with horovod.tensorflow 0.28's names, arguments and defaults.

How a TensorFlow value reaches the core, and back (``collective``):

* eagerly, ``tensor.numpy()`` (on CPU a view of the tensor's buffer) goes to the
  netreduce core (buffers.py) and the result array comes back through
  ``tf.convert_to_tensor``; netreduce's errors come out as their TensorFlow twins
  (errors.py: a shape mismatch is a tf.errors.FailedPreconditionError and a
  netreduce NegotiationError);
* in a graph (tf.function, Keras ``fit``, a TF1 Session) the call is one node of an
  asynchronous custom op (kernels/collective_ops.cc, op_bridge.py): its kernel hands
  the buffers to the core and returns at once, and TensorFlow's ``done`` comes when
  the core's handle completes. No TensorFlow thread waits for a peer, so no order
  in which TensorFlow runs independent collectives can deadlock: the core pairs
  them by name. The node's failure status has the same TensorFlow type as the
  eager error, with the same message.
* grouped calls make a list of tensors one node and one core submission, so
  negotiation and fusion see them together (DistributedGradientTape and the Keras
  optimizer cut a step's gradients at the fusion buffer size: gradient_tape.py).

Names: eager calls without ``name=`` use the core's per-call counter (every rank calls
in the same order); in a graph the name is derived at graph-construction time from
the input tensor's graph name (as Horovod does), made unique in the graph, and is the
same on every rank that built the same graph.
"""
from __future__ import annotations

from typing import Any, List

import tensorflow as tf

from netreduce.horovod_args import handle_average_backwards_compatibility  # noqa: F401
import netreduce as _nr
from netreduce.horovod_queries import (  # noqa: F401  Horovod's names, alike for every framework
    shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank,
    cross_size, is_homogeneous, mpi_built, gloo_built, nccl_built, rocm_built, ccl_built,
    ddl_built, mpi_enabled, gloo_enabled, mpi_threads_supported,
    Average, Sum, Min, Max, Adasum, Product, ReduceOp, HorovodInternalError, adapter_init)
from netreduce.ops import as_op
from netreduce.worker import process_sets as _ps

from . import errors
from .compression import Compression
from .functions import broadcast_  # noqa: F401  (horovod.tensorflow.mpi_ops has it)
from .scatter_gather import grouped_allgather
from .seam import (  # noqa: F401  (mpi_ops's names, as Horovod's module has them)
    ProcessSet, _as_tensor, _broadcast, _check_process_set, _reduce, _reduce_with_grad,
    _set_root, add_process_set, collective, default_name, global_process_set,
    normalize_name, remove_process_set, set_rank, set_size)

NetReduceError = _nr.NetReduceError

# --- lifecycle -------------------------------------------------------------------------
def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (rank, size and aggregator come from the launcher); register
    ``process_sets`` (ProcessSet objects or rank lists) as Horovod does."""
    adapter_init("netreduce.tensorflow", comm, process_sets, refusal=errors.InvalidArgumentError)


def cuda_built() -> bool:
    return False


def _executing_eagerly() -> bool:
    """horovod.tensorflow's helper (its own tests and some user code call it)."""
    return tf.executing_eagerly()


# --- allreduce -------------------------------------------------------------------------------
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
        return _allreduce_indexed_slices([tensor], op, prescale_factor, postscale_factor, name,
                                         process_set)[0]
    tensor = _as_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _reduce_with_grad([compressed], name, op, prescale_factor, postscale_factor,
                                "allreduce", process_set)[0]
    return compression.decompress(reduced, ctx)


def _allreduce_indexed_slices(slices, op, prescale_factor, postscale_factor, name, process_set):
    if op not in (Sum, Average):
        raise errors.UnsupportedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise errors.UnsupportedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
    base = None if name is None else f"{name}.sparse"
    values = grouped_allgather([s.values for s in slices], process_set=process_set,
                               name=None if base is None else f"{base}.values")
    indices = grouped_allgather([s.indices for s in slices], process_set=process_set,
                                name=None if base is None else f"{base}.indices")
    n = set_size(process_set)
    return [tf.IndexedSlices(v / tf.cast(n, v.dtype) if op is Average else v, i,
                             dense_shape=s.dense_shape)
            for v, i, s in zip(values, indices, slices)]


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
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i in range(len(tensors)) if i not in sparse]
    if sparse:
        reduced_slices = _allreduce_indexed_slices(
            [tensors[i] for i in sparse], op, prescale_factor, postscale_factor,
            None if name is None else f"{name}.s", process_set)
        for i, r in zip(sparse, reduced_slices):
            out[i] = r
    if dense:
        pairs = [compression.compress(_as_tensor(tensors[i])) for i in dense]
        reduced = _reduce_with_grad([p[0] for p in pairs], name, op, prescale_factor,
                                    postscale_factor, "grouped_allreduce", process_set)
        for i, r, (_, ctx) in zip(dense, reduced, pairs):
            out[i] = compression.decompress(r, ctx)
    return out


# --- broadcast ---------------------------------------------------------------------------------
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """root_rank's ``tensor`` on every rank (differentiable: the gradient is the
    averaged gradient on the root and zero elsewhere, as in Horovod)."""
    _check_process_set(process_set)
    root = _set_root(root_rank, process_set, "broadcast")
    tensor = _as_tensor(tensor)

    @tf.custom_gradient
    def bcast(x):
        y = _broadcast([x], root, name, "broadcast", process_set)[0]

        def grad(dy):
            reduced = _reduce([dy], None, Average, 1.0, 1.0, "broadcast.grad", process_set)[0]
            return reduced if rank() == root_rank else reduced * 0
        return y, grad
    if not tensor.dtype.is_floating:
        return _broadcast([tensor], root, name, "broadcast", process_set)[0]
    return bcast(tensor)


# --- the rest of horovod.tensorflow.mpi_ops -----------------------------------------------------
def barrier(process_set=global_process_set) -> None:
    _check_process_set(process_set)
    with _ps.using(process_set), errors.convert():
        _nr.barrier()


def join() -> int:
    with errors.convert():
        return int(_nr.join())


def size_op(process_set_id=0, name=None):
    return tf.constant(_ps.lookup(process_set_id).size(), dtype=tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    return tf.constant(int(_ps.lookup(process_set_id).included()), dtype=tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(local_size(), dtype=tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(rank(), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(local_rank(), dtype=tf.int32, name=name)


# Plain Python that builds ops: AutoGraph must not rewrite it inside tf.function.
for _name in ('allreduce', 'grouped_allreduce', 'broadcast', 'broadcast_', 'collective'):
    globals()[_name] = tf.autograph.experimental.do_not_convert(globals()[_name])
