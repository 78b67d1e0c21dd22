"""Tensor collectives with horovod.torch 0.28's names, arguments and errors.

The only work done here is turning tensors into numpy buffers and netreduce
handles into Horovod-style integer handles. A contiguous CPU tensor is handed
to the core as ``tensor.numpy()``, which shares its memory (no copy); bfloat16
crosses as its 16-bit pattern; a CUDA tensor is staged through a pinned host
copy because the data plane reads host memory.
"""
from __future__ import annotations

import inspect
import itertools
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from netreduce.horovod_args import handle_average_backwards_compatibility  # noqa: F401
import netreduce as _nr
from netreduce.horovod_queries import (  # noqa: F401  Horovod's names, alike for every framework
    shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank,
    cross_size, is_homogeneous, mpi_built, gloo_built, nccl_built, rocm_built, ccl_built,
    ddl_built, mpi_enabled, gloo_enabled, mpi_threads_supported, start_timeline, stop_timeline,
    Average, Sum, Min, Max, Adasum, Product, ReduceOp, NetReduceError, HorovodInternalError,
    ProcessSet, global_process_set, add_process_set, remove_process_set, adapter_init)
from netreduce.worker import process_sets as _ps
from netreduce.errors import InvalidArgumentError

from .compression import Compression

# dtypes netreduce reduces (bfloat16 as a 16-bit pattern; the core carries the
# narrow integer types in int32 on the wire).
_REDUCIBLE = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.float16, torch.float32, torch.float64, torch.bfloat16)
# Broadcast and allgather only move bits (every rank but one contributes zeros),
# so bool can travel widened to int32 and come back exact.
_MOVABLE = _REDUCIBLE + (torch.bool,)
_WIDEN = (torch.bool,)
# the same as sets, for the test every call makes (a tuple compares dtypes one by one)
_SETS = {id(_REDUCIBLE): frozenset(_REDUCIBLE), id(_MOVABLE): frozenset(_MOVABLE)}


def _accepts(fn: Callable, arg: str) -> bool:
    try:
        return arg in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# The core takes a uint16 buffer with dtype="bfloat16" when it supports it;
# otherwise bfloat16 goes through a float32 copy.
_CORE_BF16 = _accepts(getattr(_nr, "allreduce_async", None), "dtype")


# --- lifecycle -----------------------------------------------------------------
def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start netreduce (rank, size and aggregator come from the launcher)."""
    adapter_init("netreduce.torch", comm, process_sets)


def cuda_built() -> bool:
    return torch.cuda.is_available()


# --- handles ---------------------------------------------------------------------
class _Pending:
    """One in-flight operation: how to poll it, wait for it, and build its result."""

    __slots__ = ("poll", "wait", "finish")

    def __init__(self, poll: Callable[[], bool], wait: Callable[[], Any],
                 finish: Callable[[Any], Any]):
        self.poll, self.wait, self.finish = poll, wait, finish


class _CorePending:
    """A _Pending over one core handle, without its two closures (a gradient hook
    makes one per call)."""

    __slots__ = ("inner", "finish")

    def __init__(self, inner: Any, finish: Callable[[Any], Any]):
        self.inner, self.finish = inner, finish

    def poll(self) -> bool:
        return _nr.poll(self.inner)

    def wait(self) -> Any:
        return _nr.synchronize(self.inner)


_handles: Dict[int, Any] = {}  # handle -> _Pending or _CorePending
_handle_ids = itertools.count(1)
_handles_lock = threading.Lock()


def _register(pending: Any) -> int:
    with _handles_lock:
        handle = next(_handle_ids)
        _handles[handle] = pending
    return handle


def _core_handle(inner: Any, finish: Callable[[Any], Any]) -> int:
    return _register(_CorePending(inner, finish))


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (never blocks)."""
    with _handles_lock:
        pending = _handles.get(handle)
    if pending is None:
        raise InvalidArgumentError(f"poll(): unknown handle {handle!r} (already synchronized?)")
    return bool(pending.poll())


def synchronize(handle: int) -> Any:
    """Wait for ``handle`` and return its output tensor (list for grouped ops)."""
    with _handles_lock:
        pending = _handles.pop(handle, None)
    if pending is None:
        return None  # as Horovod: synchronizing twice is a no-op
    return pending.finish(pending.wait())


# --- tensor <-> buffer ---------------------------------------------------------------
class _Buf:
    """A tensor and the host numpy array that the core reads (and maybe writes)."""

    __slots__ = ("tensor", "host", "array", "kwargs", "cpu")

    def __init__(self, tensor: torch.Tensor, what: str, name: Optional[str],
                 allowed: Sequence[torch.dtype]):
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
        # every call runs these checks: the error text is built only when one fails
        dtype = tensor.dtype
        if dtype not in _SETS.get(id(allowed), allowed):
            names = ", ".join(str(d).replace("torch.", "") for d in allowed)
            raise InvalidArgumentError(f"{what}: {_label(name)} has unsupported dtype "
                             f"{str(dtype).replace('torch.', '')}; supported: {names}")
        if not tensor.is_contiguous():
            raise InvalidArgumentError(f"{what}: {_label(name)} of shape {list(tensor.shape)} is "
                             "not contiguous; pass tensor.contiguous()")
        # is_cpu / is_cuda: tensor.device builds a torch.device object every call
        cpu = tensor.is_cpu
        if not cpu and not tensor.is_cuda:
            raise InvalidArgumentError(f"{what}: {_label(name)} is on {tensor.device}; netreduce "
                             "takes CPU or CUDA tensors")
        self.tensor = tensor
        self.cpu = cpu
        # detach() only where numpy() needs it: torch drops the GIL in detach(), and
        # in a gradient hook the executor thread takes it there (a wait per call)
        host = tensor.detach() if tensor.requires_grad else tensor
        if not self.cpu:
            staged = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
            staged.copy_(host)  # synchronous: the data must be on the host before dispatch
            host = staged
        self.kwargs: Dict[str, Any] = _NO_KWARGS
        if dtype == torch.bfloat16:
            if _CORE_BF16:
                self.array = host.view(torch.uint16).numpy()
                self.kwargs = {"dtype": "bfloat16"}
            else:
                host = host.float()
                self.array = host.numpy()
        elif dtype in _WIDEN:
            host = host.to(torch.int32)
            self.array = host.numpy()
        else:
            self.array = host.numpy()
        self.host = host

    def shares_host(self, result: np.ndarray) -> bool:
        # bounds only (np.shares_memory would solve exactly): the core either returns
        # the very array it reduced in place or a fresh one
        return result is self.array or (isinstance(result, np.ndarray)
                                         and np.may_share_memory(result, self.array))

    def to_tensor_shaped(self, result: np.ndarray) -> torch.Tensor:
        """Like to_tensor, keeping ``result``'s own shape (a reduce-scatter's shard)."""
        return self.to_tensor(result, shape=result.shape)

    def to_tensor(self, result: np.ndarray, shape: Any = None) -> torch.Tensor:
        """The core's result array as a tensor shaped, typed and placed like the input."""
        out = torch.from_numpy(np.ascontiguousarray(result))
        dtype = self.tensor.dtype
        if dtype == torch.bfloat16 and _CORE_BF16:
            out = out.view(torch.bfloat16)
        elif out.dtype != dtype:
            out = out.to(dtype)
        shape = self.tensor.shape if shape is None else shape
        if out.shape != shape:  # a view costs ~3 µs; the core's result mostly has the shape
            out = out.reshape(shape)
        if not self.cpu:
            out = out.to(self.tensor.device)
        return out

    def write_back(self, result: np.ndarray) -> torch.Tensor:
        """Make the input tensor hold ``result`` (in-place ops); a no-op when the core
        already reduced in the tensor's own memory."""
        if self.cpu and self.host.data_ptr() == self.tensor.data_ptr() \
                and self.shares_host(result):
            return self.tensor
        with torch.no_grad():
            self.tensor.copy_(self.to_tensor(result))
        return self.tensor


_NO_KWARGS: Dict[str, Any] = {}  # shared, never written: a _Buf without a dtype hint


def _label(name: Optional[str]) -> str:
    return f"tensor {name!r}" if name else "tensor"


def _check_process_set(process_set: Any) -> None:
    if not isinstance(process_set, ProcessSet):
        raise InvalidArgumentError(f"process_set must be a ProcessSet (global_process_set or one from "
                         f"add_process_set()), got {type(process_set).__name__}")


# Runs a function's core calls on its ``process_set=`` argument's communicator.
_on_process_set = _ps.on_process_set


def _set_aware(cls):
    """An autograd Function whose backward collectives run on the process set its
    forward ran on."""
    fwd, bwd = cls.forward, cls.backward

    def forward(ctx, *args):
        ctx.nr_process_set = _ps.current()
        return fwd(ctx, *args)

    def backward(ctx, *grads):
        with _ps.using(ctx.nr_process_set):
            return bwd(ctx, *grads)
    cls.forward, cls.backward = staticmethod(forward), staticmethod(backward)
    return cls


def _set_root(root_rank: int, process_set: Any) -> int:
    """Horovod names a set's broadcast root by its rank in the job."""
    if process_set.ranks is None:
        return root_rank
    if root_rank not in process_set.ranks:
        raise InvalidArgumentError(f"root_rank {root_rank} is not in {process_set}")
    return process_set.ranks.index(root_rank)


def _scales(prescale_factor: float, postscale_factor: float) -> Dict[str, float]:
    return {"prescale_factor": float(prescale_factor), "postscale_factor": float(postscale_factor)}


# --- allreduce ---------------------------------------------------------------------
def _allreduce_async(tensor: torch.Tensor, name: Optional[str], op: Any, prescale_factor: float,
                     postscale_factor: float, inplace: bool) -> int:
    what = "allreduce_async_" if inplace else "allreduce_async"
    buf = _Buf(tensor, what, name, _REDUCIBLE)
    inner = _nr.allreduce_async(buf.array, op=op, name=name, inplace=inplace,
                                prescale_factor=float(prescale_factor),
                                postscale_factor=float(postscale_factor), **buf.kwargs)
    return _register(_CorePending(inner, buf.write_back if inplace else buf.to_tensor))


def _grad_allreduce_async_(tensor: torch.Tensor, name: Optional[str], op: Any,
                           prescale_factor: float, postscale_factor: float,
                           process_set: Any) -> int:
    """allreduce_async_ for DistributedOptimizer's gradient hooks (one per gradient,
    inside backward): the optimizer checked ``op`` and ``process_set`` when it was
    built, so the call skips the public wrapper's argument handling and goes to the
    core on the set's communicator (the same checks of the tensor, the same errors)."""
    if process_set is global_process_set:
        return _allreduce_async(tensor, name, op, prescale_factor, postscale_factor, True)
    with _ps.using(process_set):
        return _allreduce_async(tensor, name, op, prescale_factor, postscale_factor, True)


def _allreduce_now(tensor: torch.Tensor, name: Optional[str], op: Any, prescale_factor: float,
                   postscale_factor: float, inplace: bool) -> torch.Tensor:
    """A synchronous all-reduce: a named one goes through the core's synchronous call,
    which runs a steady-state step in one call on this thread (netreduce/api.py
    _steady, docs/control_plane.md "One call per steady step") and otherwise submits
    and waits as the asynchronous call does; no handle is registered."""
    if name is None:
        return synchronize(_allreduce_async(tensor, name, op, prescale_factor,
                                            postscale_factor, inplace))
    buf = _Buf(tensor, "allreduce_" if inplace else "allreduce", name, _REDUCIBLE)
    call = _nr.allreduce_ if inplace else _nr.allreduce
    result = call(buf.array, op=op, name=name, **_scales(prescale_factor, postscale_factor),
                  **buf.kwargs)
    return buf.write_back(result) if inplace else buf.to_tensor(result)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> int:
    """Start an all-reduce into a new tensor; returns a handle for poll/synchronize."""
    _check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, name, op, prescale_factor, postscale_factor, inplace=False)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> int:
    """Start an in-place all-reduce of ``tensor``; returns a handle."""
    _check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, name, op, prescale_factor, postscale_factor, inplace=True)


@_set_aware
class HorovodAllreduce(torch.autograd.Function):
    """All-reduce whose gradient is the all-reduce (same op and scales) of the gradient."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.op, ctx.scales = op, (prescale_factor, postscale_factor)
        return _allreduce_now(tensor, name, op, prescale_factor, postscale_factor, inplace=False)

    @staticmethod
    def backward(ctx, grad_output):
        reduced = synchronize(_allreduce_async(grad_output.contiguous(), None, ctx.op,
                                               *ctx.scales, inplace=False))
        return reduced, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """All-reduce ``tensor`` across ranks into a new tensor (autograd-aware)."""
    _check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    compressed, ctx = compression.compress(tensor)
    if torch.is_grad_enabled() and isinstance(compressed, torch.Tensor) \
            and compressed.requires_grad:
        reduced = HorovodAllreduce.apply(compressed, name, op, prescale_factor, postscale_factor)
    else:  # no gradient to carry: the Function's bookkeeping (~8 µs a call) buys nothing
        reduced = _allreduce_now(compressed, name, op, prescale_factor, postscale_factor,
                                 inplace=False)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """All-reduce ``tensor`` in place and return it."""
    _check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_now(tensor, name, op, prescale_factor, postscale_factor, inplace=True)


# --- grouped allreduce -----------------------------------------------------------------
def _grouped_async(tensors, name, op, prescale_factor, postscale_factor, inplace) -> int:
    what = "grouped_allreduce_async_" if inplace else "grouped_allreduce_async"
    tensors = list(tensors)
    if not tensors:
        raise InvalidArgumentError(f"{what}: empty list of tensors")
    bufs = [_Buf(t, what, name, _REDUCIBLE) for t in tensors]
    extra = bufs[0].kwargs if all(b.kwargs == bufs[0].kwargs for b in bufs) else None
    if extra is None:  # a bfloat16 tensor mixed with others: the core takes one dtype hint
        raise InvalidArgumentError(f"{what}: bfloat16 tensors must be grouped on their own")
    inner = _nr.grouped_allreduce_async([b.array for b in bufs], op=op, name=name,
                                        inplace=inplace,
                                        **_scales(prescale_factor, postscale_factor), **extra)

    def finish(results):
        if inplace:
            return [b.write_back(r) for b, r in zip(bufs, results)]
        return [b.to_tensor(r) for b, r in zip(bufs, results)]
    return _core_handle(inner, finish)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    _check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_async(tensors, name, op, prescale_factor, postscale_factor, inplace=False)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    _check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_async(tensors, name, op, prescale_factor, postscale_factor, inplace=True)


@_set_aware
class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.scales = op, (prescale_factor, postscale_factor)
        return tuple(synchronize(_grouped_async(tensors, name, op, prescale_factor,
                                                postscale_factor, inplace=False)))

    @staticmethod
    def backward(ctx, *grads):
        grads = [g.contiguous() for g in grads]
        reduced = synchronize(_grouped_async(grads, None, ctx.op, *ctx.scales, inplace=False))
        return (None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set) -> List[torch.Tensor]:
    """All-reduce a list of tensors as one fused operation (autograd-aware)."""
    _check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(name, op, prescale_factor, postscale_factor,
                                            *[p[0] for p in pairs])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# --- broadcast --------------------------------------------------------------------------
def _broadcast_async(tensor, root_rank, name, inplace) -> int:
    what = "broadcast_async_" if inplace else "broadcast_async"
    buf = _Buf(tensor, what, name, _MOVABLE)
    if not inplace:  # the root's data lands in a copy, never in the caller's tensor
        buf = _Buf(tensor.detach().clone(), what, name, _MOVABLE)
    inner = _nr.broadcast_async(buf.array, root_rank, name, inplace=True, **buf.kwargs)
    return _core_handle(inner, buf.write_back)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    _check_process_set(process_set)
    return _broadcast_async(tensor, _set_root(root_rank, process_set), name, inplace=False)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    _check_process_set(process_set)
    return _broadcast_async(tensor, _set_root(root_rank, process_set), name, inplace=True)


@_set_aware
class HorovodBroadcast(torch.autograd.Function):
    """Broadcast whose gradient is the averaged gradient on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return synchronize(_broadcast_async(tensor, root_rank, name, inplace=False))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = synchronize(_allreduce_async(grad_output.contiguous(), None, Average,
                                               1.0, 1.0, inplace=False))
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Return root_rank's ``tensor`` on every rank (autograd-aware)."""
    _check_process_set(process_set)
    return HorovodBroadcast.apply(tensor, _set_root(root_rank, process_set), name)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with root_rank's values in place."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --- exact sums (allgather and reducescatter live in scatter_gather.py) ---------------
def _exact_sum_async_(tensor: torch.Tensor, name: Optional[str]) -> int:
    """In-place Sum of a buffer in which at most one rank holds non-zeros per element:
    delivers every value exactly, for every movable dtype (x + 0 is exact, and 16-bit
    floats are summed in float32); the one change is that -0.0 arrives as +0.0."""
    buf = _Buf(tensor, "allgather", name, _MOVABLE)
    inner = _nr.allreduce_async(buf.array, op=Sum, name=name, inplace=True, **buf.kwargs)
    return _core_handle(inner, buf.write_back)


# --- barrier, join -------------------------------------------------------------------------
def barrier(process_set=global_process_set) -> None:
    _check_process_set(process_set)
    _nr.barrier()


def join(device: int = -1) -> int:
    """Wait for every rank to join; returns the rank that joined last.

    With a core that implements ``join`` (joined ranks contribute zeros to the others'
    collectives, Horovod's uneven-input semantics) it is used. Otherwise every rank must
    reach join() with no collective outstanding, and the last arrival is found from the
    ranks' wall clocks."""
    if hasattr(_nr, "join"):
        return int(_nr.join())
    arrivals = _nr.allgather_object(time.time())
    return int(max(range(len(arrivals)), key=lambda r: arrivals[r]))


for _name in ("allreduce_async", "allreduce_async_", "allreduce", "allreduce_",
              "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_allreduce",
              "grouped_allreduce_", "broadcast_async", "broadcast_async_", "broadcast",
              "broadcast_", "barrier"):
    globals()[_name] = _on_process_set(globals()[_name])
