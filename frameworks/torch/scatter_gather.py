"""horovod.torch 0.28's allgather and reducescatter families (plain, grouped, async,
autograd), over the core's ``allgather_async`` / ``reducescatter_async``
(netreduce/algorithms/scatter_gather.py says how they travel).

Gradients are Horovod's: an allgather's is the averaged gradient's own rows; a
reducescatter's is the allgather of the gradient, times size() for Sum and times
the scale factors (torch/mpi_ops.py in Horovod 0.28.1).
"""
from __future__ import annotations

from typing import List

import torch

from netreduce import api as _api
from netreduce.alltoall import alltoall_async as _alltoall_async
from netreduce.errors import InvalidArgumentError

from .compression import Compression
from .mpi_ops import (_MOVABLE, _REDUCIBLE, Average, Sum, _Buf, _check_process_set,
                      _core_handle, _on_process_set, _set_aware,
                      global_process_set,
                      handle_average_backwards_compatibility, rank, size, synchronize,
                      allreduce)


# --- allgather -------------------------------------------------------------------------
def _allgather_async(tensors, name, what: str, grouped: bool) -> int:
    tensors = list(tensors)
    if grouped and not tensors:
        raise InvalidArgumentError(f"{what}: empty list of tensors")
    bufs = [_Buf(t, what, name, _MOVABLE) for t in tensors]
    extra = bufs[0].kwargs
    if any(b.kwargs != extra for b in bufs):
        raise InvalidArgumentError(f"{what}: bfloat16 tensors must be grouped on their own")
    arrays = [b.array for b in bufs]
    if grouped:
        inner = _api.grouped_allgather_async(arrays, name, **extra)
    else:
        inner = _api.allgather_async(arrays[0], name, **extra)

    def to_tensor(buf, result):
        out = torch.from_numpy(result)
        if buf.tensor.dtype == torch.bfloat16 and extra:
            out = out.view(torch.bfloat16)
        elif out.dtype != buf.tensor.dtype:
            out = out.to(buf.tensor.dtype)
        return out.to(buf.tensor.device) if buf.tensor.device.type != "cpu" else out

    def finish(result):
        if grouped:
            return [to_tensor(b, r) for b, r in zip(bufs, result)]
        return to_tensor(bufs[0], result)
    return _core_handle(inner, finish)


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dim 0 (the first dimensions
    may differ, the others must agree); returns a handle at once."""
    _check_process_set(process_set)
    return _allgather_async([tensor], name, "allgather_async", grouped=False)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    _check_process_set(process_set)
    return _allgather_async(tensors, name, "grouped_allgather_async", grouped=True)


def _own_rows(grad: torch.Tensor, rows: int) -> torch.Tensor:
    counts = synchronize(_allgather_async([torch.tensor([rows], dtype=torch.int64)], None,
                                          "allgather", grouped=False))
    offset = int(counts[:rank()].sum())
    return grad.narrow(0, offset, rows)


@_set_aware
class HorovodAllgather(torch.autograd.Function):
    """Allgather whose gradient is this rank's rows of the averaged gradient."""

    @staticmethod
    def forward(ctx, tensor, name):
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        return synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), op=Average)
        return _own_rows(reduced, ctx.rows), None


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0, in rank order (autograd-aware)."""
    _check_process_set(process_set)
    return HorovodAllgather.apply(tensor, name)


@_set_aware
class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, *tensors):
        ctx.rows = [t.shape[0] if t.dim() else 1 for t in tensors]
        return tuple(synchronize(grouped_allgather_async(list(tensors), name)))

    @staticmethod
    def backward(ctx, *grads):
        from .mpi_ops import grouped_allreduce
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=Average)
        return (None, *[_own_rows(g, r) for g, r in zip(reduced, ctx.rows)])


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> List[torch.Tensor]:
    _check_process_set(process_set)
    return list(HorovodGroupedAllgather.apply(name, *tensors))


# --- alltoall ------------------------------------------------------------------------------
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """Start sending rows ``splits[r]`` (consecutive, in rank order) of ``tensor`` to
    rank r; synchronize returns (received rows in rank order, received_splits).

    The core's relayed alltoall (netreduce/alltoall.py: every rank's rows and splits
    are all-gathered, each rank keeps its own; N times the bytes a peer-to-peer
    alltoall delivers) with Horovod's split checks and errors."""
    _check_process_set(process_set)
    if isinstance(splits, torch.Tensor):
        if splits.dtype != torch.int32:
            raise InvalidArgumentError("alltoall expects splits to contain 32-bit integer "
                                       "elements.")
        splits = splits.reshape(-1).cpu().numpy()
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"alltoall: expected a torch.Tensor, got {type(tensor).__name__}")
    buf = _Buf((tensor.reshape(1) if tensor.dim() == 0 else tensor).contiguous(), "alltoall",
               name, _MOVABLE)
    inner = _alltoall_async(buf.array, splits, name, **buf.kwargs)

    def finish(result):
        received, counts = result
        return buf.to_tensor_shaped(received), torch.from_numpy(counts)
    return _core_handle(inner, finish)


@_set_aware
class HorovodAlltoall(torch.autograd.Function):
    """Alltoall whose gradient is the alltoall of the gradient with the received
    splits (Horovod's)."""

    @staticmethod
    def forward(ctx, tensor, splits, name):
        output, received = synchronize(alltoall_async(tensor, splits, name))
        ctx.received = received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *dead):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received))
        return grad, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Rows ``splits[r]`` of ``tensor`` to rank r; returns the received rows, and
    the received splits when ``splits`` was given (autograd-aware)."""
    _check_process_set(process_set)
    return HorovodAlltoall.apply(tensor, splits, name)


# --- sparse ------------------------------------------------------------------------------
def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Horovod's sparse all-reduce: all-gather the indices and the values (each rank
    may have a different number of non-zeros), then build the summed sparse tensor
    (duplicate indices add up when it is coalesced). Returns a function that waits
    and returns the result, as Horovod's does."""
    _check_process_set(process_set)
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise InvalidArgumentError("sparse_allreduce_async: expected a sparse torch.Tensor")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices = allgather_async(t._indices().transpose(0, 1).contiguous(),
                              name=f"{name}.indices" if name else None)
    values = allgather_async(t._values().contiguous(), name=f"{name}.values" if name else None)
    n = size()  # of the set this runs on, not of the thread that waits

    def handle():
        vals = synchronize(values)
        idx = synchronize(indices)
        if op == Average:
            vals = vals / n
        if idx.dim() == 0 or vals.dim() == 0:
            return t.new().resize_as_(t)
        return torch.sparse_coo_tensor(idx.transpose(0, 1), vals, t.size(), check_invariants=False)
    return handle


# --- reducescatter -----------------------------------------------------------------------
def _reducescatter_async(tensors, name, op, prescale_factor, postscale_factor, what: str,
                         grouped: bool) -> int:
    tensors = list(tensors)
    if grouped and not tensors:
        raise InvalidArgumentError(f"{what}: empty list of tensors")
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() == 0:
            raise InvalidArgumentError("Reducescatter does not support scalar inputs")
    bufs = [_Buf(t, what, name, _REDUCIBLE) for t in tensors]
    extra = bufs[0].kwargs
    if any(b.kwargs != extra for b in bufs):
        raise InvalidArgumentError(f"{what}: bfloat16 tensors must be grouped on their own")
    scales = {"prescale_factor": float(prescale_factor),
              "postscale_factor": float(postscale_factor)}
    arrays = [b.array for b in bufs]
    if grouped:
        inner = _api.grouped_reducescatter_async(arrays, op, name, **scales, **extra)
    else:
        inner = _api.reducescatter_async(arrays[0], op, name, **scales, **extra)

    def finish(result):
        outs = [b.to_tensor_shaped(r) for b, r in zip(bufs, result if grouped else [result])]
        return outs if grouped else outs[0]
    return _core_handle(inner, finish)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Start reducing ``tensor`` (same shape on every rank) and keeping this rank's
    rows of the result: dim 0 split so that the first ``dim0 % size`` ranks get one
    row more (Horovod's split)."""
    _check_process_set(process_set)
    return _reducescatter_async([tensor], name, op, prescale_factor, postscale_factor,
                                "reducescatter_async", grouped=False)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    _check_process_set(process_set)
    return _reducescatter_async(tensors, name, op, prescale_factor, postscale_factor,
                                "grouped_reducescatter_async", grouped=True)


def _scale_grads(ctx, grads):
    factor = (size() if ctx.op == Sum else 1) * ctx.pre * ctx.post
    return [g * factor if factor != 1 else g for g in grads]


@_set_aware
class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        return synchronize(_reducescatter_async([tensor], name, op, prescale_factor,
                                                postscale_factor, "reducescatter", False))

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = _scale_grads(ctx, [grad_output.contiguous()])
        return allgather(grad), None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0,
                  postscale_factor=1.0) -> torch.Tensor:
    """This rank's rows of the reduction of ``tensor`` over all ranks (autograd-aware)."""
    _check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, None)
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(out, cctx)


@_set_aware
class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        return tuple(synchronize(_reducescatter_async(tensors, name, op, prescale_factor,
                                                      postscale_factor,
                                                      "grouped_reducescatter", True)))

    @staticmethod
    def backward(ctx, *grads):
        scaled = _scale_grads(ctx, [g.contiguous() for g in grads])
        return (None, None, None, None, *grouped_allgather(scaled))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0) -> List[torch.Tensor]:
    _check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, None)
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(name, op, prescale_factor, postscale_factor,
                                             *[p[0] for p in pairs])
    return [compression.decompress(t, c) for t, (_, c) in zip(outs, pairs)]


for _name in ("allgather_async", "grouped_allgather_async", "allgather", "grouped_allgather",
              "alltoall_async", "alltoall", "sparse_allreduce_async", "reducescatter_async",
              "grouped_reducescatter_async", "reducescatter", "grouped_reducescatter"):
    globals()[_name] = _on_process_set(globals()[_name])
