"""NDArray collectives with horovod.mxnet 0.28's names, arguments and defaults.

Horovod's MXNet operations are pushed to MXNet's engine and return at once; these
are synchronous: each call waits for the engine to finish writing its inputs, hands
their memory to the core without a copy (buffers.py), and returns when the result is
in place. ``grouped_allreduce`` submits all of its tensors before waiting, so the core
negotiates and fuses them together. ``priority`` is accepted for Horovod's
signatures; with synchronous calls the order of the calls is the order of execution
(DistributedTrainer submits its gradients in Horovod's priority order, -index).

``process_set=`` runs a call on a process set (netreduce/worker/process_sets.py: each set is
a sub-job at the aggregator); broadcast roots are job ranks, as in Horovod. The
allgather, alltoall and reducescatter families are in scatter_gather.py.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import mxnet as mx

from netreduce.horovod_args import handle_average_backwards_compatibility  # noqa: F401
import netreduce as _nr
from netreduce.worker import process_sets as _ps
from netreduce.horovod_queries import (  # noqa: F401  Horovod's names, alike for every framework
    shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank,
    cross_size, mpi_built, gloo_built, nccl_built, rocm_built, ccl_built, ddl_built,
    mpi_enabled, gloo_enabled, mpi_threads_supported, start_timeline, stop_timeline,
    Average, Sum, Min, Max, Adasum, Product, ReduceOp, NetReduceError,
    ProcessSet, global_process_set, add_process_set, remove_process_set, adapter_init)

from .buffers import HostBuffer

on_process_set = _ps.on_process_set


# --- lifecycle -----------------------------------------------------------------------
def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (rank, size and aggregator come from the launcher); then register
    ``process_sets`` (as add_process_set on every rank would)."""
    adapter_init("netreduce.mxnet", comm, process_sets)


def cuda_built() -> bool:
    return mx.context.num_gpus() > 0


@on_process_set
def barrier(process_set=global_process_set) -> None:
    _nr.barrier()


# --- ops ---------------------------------------------------------------------------------
def _submit_and_wait(tensors: Sequence[Any], names: Sequence[Optional[str]], what: str,
                     submit: Callable[[Any, Optional[str]], Any]) -> None:
    """``submit(host array, name)`` for every NDArray of ``tensors``, then wait for each
    handle and write the results back. The first error is raised after every submitted
    tensor has finished, so no memory is still being written when the caller sees it."""
    bufs = [HostBuffer(t, what, n, write=True) for t, n in zip(tensors, names)]
    handles, error = [], None
    for buf, name in zip(bufs, names):
        try:
            handles.append(submit(buf.array, name))
        except Exception as exc:
            error = exc
            break
    for handle in handles:
        try:
            handle.wait()
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error
    for buf in bufs:
        buf.write_back()


def reduce_in_place(tensors: Sequence[Any], names: Sequence[Optional[str]], op: Any,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    what: str = "allreduce_") -> None:
    """All-reduce every NDArray of ``tensors`` in place, submitted together (one
    negotiation and fusion round), and wait for all of them."""
    _submit_and_wait(tensors, names, what, lambda array, name: _nr.allreduce_async(
        array, op=op, name=name, prescale_factor=float(prescale_factor),
        postscale_factor=float(postscale_factor), inplace=True))


@on_process_set
def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set, op=None):
    """Average (or ``op``) ``tensor`` over all ranks into a new NDArray; ``tensor``
    is not modified."""
    output = tensor.copy()
    return allreduce_(output, average, name, priority, prescale_factor, postscale_factor,
                      process_set, op)


@on_process_set
def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, op=None):
    """All-reduce ``tensor`` in place; returns it."""
    op = handle_average_backwards_compatibility(op, average)
    reduce_in_place([tensor], [name], op, prescale_factor, postscale_factor)
    return tensor


@on_process_set
def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, op=None):
    """All-reduce a list of NDArrays into new ones, negotiated and fused together."""
    outputs = [t.copy() for t in tensors]
    return grouped_allreduce_(outputs, average, name, priority, prescale_factor,
                              postscale_factor, process_set, op)


@on_process_set
def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, op=None):
    """All-reduce a list of NDArrays in place; returns the list."""
    op = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    if not tensors:
        return tensors
    names = [f"{name}.{i}" if name is not None else None for i in range(len(tensors))]
    reduce_in_place(tensors, names, op, prescale_factor, postscale_factor,
                    what="grouped_allreduce_")
    return tensors


def broadcast_many(tensors: Sequence[Any], names: Sequence[Optional[str]], root_rank: int,
                   what: str = "broadcast_") -> None:
    """Overwrite every NDArray of ``tensors`` with root_rank's, in place, submitted
    together; waits for all of them."""
    _submit_and_wait(tensors, names, what,
                     lambda array, name: _nr.broadcast_async(array, root_rank, name, inplace=True))


@on_process_set
def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """root_rank's ``tensor`` as a new NDArray on every rank."""
    output = tensor.copy()
    return broadcast_(output, root_rank, name, priority, process_set)


@on_process_set
def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """Overwrite ``tensor`` with root_rank's (a job rank), in place; returns it."""
    broadcast_many([tensor], [name], _ps.root_in_set(root_rank, process_set))
    return tensor


@on_process_set
def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set=global_process_set) -> Any:
    return _nr.broadcast_object(obj, _ps.root_in_set(root_rank, process_set), name)


@on_process_set
def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set=global_process_set) -> List[Any]:
    return _nr.allgather_object(obj, name)
