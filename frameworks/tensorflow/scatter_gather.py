"""horovod.tensorflow 0.28's allgather, alltoall and reducescatter families, eagerly
and in graphs (mpi_ops.collective), over the core's allgather / reducescatter
(netreduce/algorithms/scatter_gather.py says how they travel).

Gradients are Horovod's (horovod/tensorflow/mpi_ops.py 0.28.1):
* allgather: the averaged gradient (all-reduce, Average), this rank's rows of it;
* alltoall: the alltoall of the gradient with the received splits;
* reducescatter: the allgather of the gradient, times the set's size for Sum and
  times the scale factors.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from netreduce.algorithms.scatter_gather import shard_rows
from netreduce.horovod_queries import is_initialized
from netreduce.ops import Average, Sum, as_op

from . import buffers, errors
from .compression import Compression
from .seam import (_as_tensor, _check_process_set, _reduce, collective, default_name,
                   global_process_set, set_rank, set_size)


# --- allgather -----------------------------------------------------------------------------
def _allgather(tensors: Sequence[tf.Tensor], name: Optional[str], kind: str,
               process_set: Any) -> List[tf.Tensor]:
    call = buffers.spec("allgather", default_name(kind, tensors, name),
                        process_set_id=process_set.process_set_id)
    return collective("allgather", tensors, call)


def _own_rows(grads: Sequence[tf.Tensor], xs: Sequence[tf.Tensor], process_set: Any
              ) -> List[tf.Tensor]:
    """This rank's rows of each (averaged) gradient: every rank's first dimension is
    all-gathered (they may differ) to find where this rank's rows start."""
    rows = [tf.reshape(tf.shape(x, out_type=tf.int32)[0] if x.shape.rank != 0
                       else tf.constant(1, tf.int32), [1]) for x in xs]
    counts = _allgather(rows, None, "allgather.grad.rows", process_set)
    me = set_rank(process_set)
    out = []
    for g, c, x in zip(grads, counts, xs):
        start = tf.reduce_sum(c[:me])
        mine = g[start:start + c[me]]
        out.append(tf.reshape(mine, tf.shape(x)) if x.shape.rank == 0 else mine)
    return out


def _allgather_with_grad(tensors: List[tf.Tensor], name: Optional[str], kind: str,
                         process_set: Any) -> List[tf.Tensor]:
    floating = [t.dtype.is_floating for t in tensors]
    if not all(floating):  # integer/bool tensors have no gradient
        return _allgather(tensors, name, kind, process_set)

    @tf.custom_gradient
    def gathered(*xs):
        ys = _allgather(xs, name, kind, process_set)

        def grad(*dys):
            dys = [tf.zeros_like(y) if d is None else d for y, d in zip(ys, dys)]
            reduced = _reduce(dys, None, Average, 1.0, 1.0, kind + ".grad", process_set)
            return _own_rows(reduced, xs, process_set)
        return ys, grad
    out = gathered(*tensors)
    return [out] if isinstance(out, tf.Tensor) else list(out)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order
    (the first dimensions may differ, the others must agree; differentiable)."""
    _check_process_set(process_set)
    return _allgather_with_grad([_as_tensor(tensor)], name, "allgather", process_set)[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """allgather of each tensor, as one core submission (differentiable)."""
    _check_process_set(process_set)
    tensors = [_as_tensor(t) for t in tensors]
    if not tensors:
        return tensors
    return _allgather_with_grad(tensors, name, "grouped_allgather", process_set)


# --- alltoall ------------------------------------------------------------------------------
def _alltoall(tensor: tf.Tensor, splits: tf.Tensor, name: Optional[str], process_set: Any):
    call = buffers.spec("alltoall", default_name("alltoall", [tensor], name),
                        process_set_id=process_set.process_set_id)
    output, received = collective("alltoall", [tensor], call, splits=splits)
    if not tf.executing_eagerly() and is_initialized():
        received.set_shape([set_size(process_set)])
    return output, received


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Rows ``splits[r]`` (consecutive, in rank order) of ``tensor`` to rank r of the
    set; returns the rows received, in rank order, and — when ``splits`` was given —
    how many came from each rank (differentiable: the gradient is the alltoall of
    the gradient with the received splits)."""
    _check_process_set(process_set)
    tensor = _as_tensor(tensor)
    n = set_size(process_set) if is_initialized() else None  # a graph built before init()
    given = splits is not None
    if given:
        splits = tf.convert_to_tensor(splits)
        if splits.dtype != tf.int32:
            raise errors.InvalidArgumentError("alltoall expects splits to contain 32-bit "
                                              "integer elements.")
    else:
        splits = tf.constant([], dtype=tf.int32)
    # Known values fail here, at the call; a dynamic shape or splits fails in the kernel.
    rank_ = tensor.shape.rank
    rows = 1 if rank_ == 0 else (tensor.shape[0] if rank_ is not None else None)
    values = tf.get_static_value(splits)
    if n is not None and rows is not None and values is not None:
        with errors.convert():
            buffers.check_splits(rows, values, n)

    if tensor.dtype.is_floating:
        @tf.custom_gradient
        def exchanged(x):
            out, received = _alltoall(x, splits, name, process_set)

            def grad(d_out, d_received=None):
                back, _ = _alltoall(d_out, received, None, process_set)
                return back
            return (out, received), grad
        output, received = exchanged(tensor)
    else:
        output, received = _alltoall(tensor, splits, name, process_set)
    return (output, received) if given else output


# --- reducescatter -------------------------------------------------------------------------
def _reducescatter(tensors: Sequence[tf.Tensor], name: Optional[str], op: Any,
                   prescale_factor: float, postscale_factor: float, kind: str,
                   process_set: Any) -> List[tf.Tensor]:
    for t in tensors:
        if t.shape.rank == 0:
            raise errors.InvalidArgumentError("Reducescatter does not support scalar inputs")
        if t.dtype == tf.bool:
            raise errors.InvalidArgumentError(f"{kind}: tensor {name or t.name!r} has dtype "
                                              "bool, which netreduce cannot reduce")
    call = buffers.spec("reducescatter", default_name(kind, tensors, name), op,
                        prescale_factor, postscale_factor,
                        process_set_id=process_set.process_set_id)
    outs = collective("reducescatter", tensors, call)
    if not tf.executing_eagerly() and is_initialized():
        n, me = set_size(process_set), set_rank(process_set)
        for t, out in zip(tensors, outs):
            if t.shape.rank is not None and t.shape[0] is not None:
                out.set_shape([shard_rows(t.shape[0], n, me)[1]] + t.shape[1:].as_list())
            elif t.shape.rank is not None:
                out.set_shape([None] + t.shape[1:].as_list())
    return outs


def _reducescatter_with_grad(tensors, name, op, prescale_factor, postscale_factor, kind,
                             process_set) -> List[tf.Tensor]:
    if not all(t.dtype.is_floating for t in tensors):
        return _reducescatter(tensors, name, op, prescale_factor, postscale_factor, kind,
                              process_set)
    @tf.custom_gradient
    def scattered(*xs):
        ys = _reducescatter(xs, name, op, prescale_factor, postscale_factor, kind, process_set)

        def grad(*dys):
            factor = (set_size(process_set) if op is Sum else 1) * prescale_factor * \
                postscale_factor
            dys = [tf.zeros_like(y) if d is None else d for y, d in zip(ys, dys)]
            scaled = [d * tf.cast(factor, d.dtype) if factor != 1 else d for d in dys]
            return _allgather(scaled, None, kind + ".grad", process_set)
        return ys, grad
    out = scattered(*tensors)
    return [out] if isinstance(out, tf.Tensor) else list(out)


def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average,
                  name=None, process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """This rank's rows of the reduction of ``tensor`` (same shape on every rank; the
    first ``dim0 % size`` ranks get one row more, as in Horovod; differentiable)."""
    _check_process_set(process_set)
    op = as_op(op)
    compressed, ctx = compression.compress(_as_tensor(tensor))
    out = _reducescatter_with_grad([compressed], name, op, prescale_factor, postscale_factor,
                                   "reducescatter", process_set)[0]
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, name=None):
    """reducescatter of each tensor, as one core submission (differentiable)."""
    _check_process_set(process_set)
    if not tensors:
        return tensors
    op = as_op(op)
    pairs = [compression.compress(_as_tensor(t)) for t in tensors]
    outs = _reducescatter_with_grad([p[0] for p in pairs], name, op, prescale_factor,
                                    postscale_factor, "grouped_reducescatter", process_set)
    return [compression.decompress(t, c) for t, (_, c) in zip(outs, pairs)]


# Plain Python that builds ops: AutoGraph must not rewrite it inside tf.function.
for _name in ('allgather', 'grouped_allgather', 'alltoall', 'reducescatter', 'grouped_reducescatter'):
    globals()[_name] = tf.autograph.experimental.do_not_convert(globals()[_name])
