"""horovod.mxnet 0.28's allgather, alltoall and reducescatter families over the
core's (netreduce/algorithms/scatter_gather.py and netreduce/alltoall.py say how they
travel). Synchronous like the rest of this adapter: inputs are read in place
(buffers.py), and the result is a new NDArray on the input's context — one copy of
the result, whose size (the gathered rows, this rank's shard) only the collective
decides. Horovod's MXNet collectives have no autograd, and neither do these.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import mxnet as mx
import numpy as np

import netreduce as _nr
from netreduce import api as _api
from netreduce.alltoall import alltoall_async as _alltoall_async
from netreduce.errors import InvalidArgumentError

from .buffers import HostBuffer
from .mpi_ops import Average, global_process_set, on_process_set


def _to_nd(result: np.ndarray, like) -> Any:
    return mx.nd.array(result, ctx=like.context, dtype=result.dtype)


def _views(tensors: Sequence[Any], what: str, name: Optional[str]) -> List[np.ndarray]:
    tensors = list(tensors)
    if not tensors:
        raise InvalidArgumentError(f"{what}: empty list of tensors")
    return [HostBuffer(t, what, name, write=False).array for t in tensors]


# --- allgather -------------------------------------------------------------------------
@on_process_set
def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """Every rank's ``tensor`` concatenated along dimension 0, in rank order (the first
    dimensions may differ, the others must agree); ``tensor`` is not modified."""
    (array,) = _views([tensor], "allgather", name)
    return _to_nd(_nr.synchronize(_api.allgather_async(array, name)), tensor)


@on_process_set
def grouped_allgather(tensors, name=None, priority=0, process_set=global_process_set):
    """allgather of each NDArray of ``tensors``, negotiated and fused together."""
    tensors = list(tensors)
    arrays = _views(tensors, "grouped_allgather", name)
    results = _nr.synchronize(_api.grouped_allgather_async(arrays, name))
    return [_to_nd(r, t) for r, t in zip(results, tensors)]


# --- alltoall ----------------------------------------------------------------------------
@on_process_set
def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Rows ``splits[r]`` (consecutive, in rank order) of ``tensor`` to rank r of the
    set; returns the rows received from every rank in rank order, and — when
    ``splits`` was given — an int32 NDArray (CPU) of how many came from each."""
    (array,) = _views([tensor], "alltoall", name)
    if isinstance(splits, mx.nd.NDArray):
        splits = splits.asnumpy()  # keeps its dtype: a float32 vector is Horovod's error
    received, counts = _nr.synchronize(_alltoall_async(array, splits, name))
    output = _to_nd(received, tensor)
    if splits is None:
        return output
    return output, mx.nd.array(counts, ctx=mx.cpu(), dtype=np.int32)


# --- reducescatter -----------------------------------------------------------------------
def _reducescatter(tensors, op, name, prescale_factor, postscale_factor, what: str,
                   grouped: bool):
    tensors = list(tensors)
    if any(len(t.shape) == 0 for t in tensors if isinstance(t, mx.nd.NDArray)):
        label = f" (tensor {name!r})" if name is not None else ""
        raise InvalidArgumentError(f"{what} does not support scalar inputs{label}")
    arrays = _views(tensors, what, name)
    scales = {"prescale_factor": float(prescale_factor),
              "postscale_factor": float(postscale_factor)}
    if grouped:
        results = _nr.synchronize(_api.grouped_reducescatter_async(arrays, op, name, **scales))
    else:
        results = [_nr.synchronize(_api.reducescatter_async(arrays[0], op, name, **scales))]
    return [_to_nd(r, t) for r, t in zip(results, tensors)]


@on_process_set
def reducescatter(tensor, op=Average, name=None, priority=0, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """This rank's rows of the reduction (Average by default, or Sum, Min, Max) of
    ``tensor`` over the set: dimension 0 split so that the first ``dim0 % size`` ranks
    get one row more (Horovod's split). ``tensor`` is not modified."""
    return _reducescatter([tensor], op, name, prescale_factor, postscale_factor,
                          "reducescatter", grouped=False)[0]


@on_process_set
def grouped_reducescatter(tensors, op=Average, name=None, priority=0,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each NDArray of ``tensors``, negotiated and fused together."""
    return _reducescatter(tensors, op, name, prescale_factor, postscale_factor,
                          "grouped_reducescatter", grouped=True)
