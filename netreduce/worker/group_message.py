"""One fusion group as one data-plane message, on the executor's thread: each
tensor's contribution copied into the fusion buffer (with its prescale), the
all-reduce, each result copied out (with its postscale or average). A lone tensor in
its own dtype is reduced in place, with no copy. Barriers and joins carry no data;
all-gathers and reduce-scatters go to netreduce/algorithms/scatter_gather.py.

The communicator (netreduce/worker/communicator.py) decides which groups run and
when, and finishes their handles; this module only moves their data. The speculative
steady step (speculation.py) shares ``copy_in`` / ``copy_out`` for the dtypes its
native path does not take."""
from __future__ import annotations

from typing import Any, List, Tuple, cast

import numpy as np

from netreduce.algorithms.scatter_gather import run as run_scatter_gather
from netreduce.ops import STORAGE, WIRE_DTYPE, ReduceOp, scale_into
from netreduce.worker import timeline as tl
from netreduce.worker.fusion_buffer import FusionBuffer
from netreduce.worker.handle import Tensor


def _data(t: Tensor) -> Tuple[np.ndarray, np.ndarray]:
    """``t``'s input and output arrays: every tensor that reaches a message has both
    (only barriers and joins have none, and they carry no data)."""
    return cast(np.ndarray, t.array), cast(np.ndarray, t.output)


def run(comm: Any, group: List[Tensor]) -> None:
    """Reduce ``group`` (a log entry's, or one agreed by a round) on ``comm``'s data
    plane; raises what the data plane raises."""
    first = group[0]
    if first.kind in ("barrier", "join"):
        return
    if first.kind in ("allgatherv", "reducescatter"):
        run_scatter_gather(comm, group)
        return
    wire = WIRE_DTYPE[first.dtype]
    storage = STORAGE[wire]
    wire_op = "sum" if first.kind == "broadcast" or first.op is ReduceOp.Average \
        else cast(ReduceOp, first.op).wire
    dp_dtype = "bfloat16" if wire == "bfloat16" else None
    counts = [_data(t)[1].size for t in group]
    total = sum(counts)
    t0 = tl.now_us()
    array, out = _data(first)
    if len(group) == 1 and storage == out.dtype and \
            (first.kind == "broadcast" or first.sig.prescale == 1.0):
        # One tensor in its own dtype: reduce straight into the output, no copies.
        contributes = first.kind != "broadcast" or comm.rank == first.sig.root
        if not contributes:
            out.fill(0)  # a broadcast's non-root sends zeros: the sum is the root's data
        src = array if contributes else out
        scale = engine_scale(comm, first, wire_op)
        t1 = tl.now_us()
        if total:  # scale != 1.0: the engine scales as it copies each result in
            comm.dp.allreduce(src, None if src is out else out, op=wire_op, dtype=dp_dtype,
                              scale=scale)
        t2 = tl.now_us()
        copy_out(first, out, comm.size, scaled=scale != 1.0)
    else:
        if total * storage.itemsize <= comm.fusion.capacity:
            buf = comm.fusion.view(storage, total)
        else:  # lone tensor bigger than the fusion buffer, carried in a wider type
            buf = np.empty(total, dtype=storage)
        spans = FusionBuffer.offsets(counts)
        for t, (a, b) in zip(group, spans):
            copy_in(t, buf[a:b], comm.rank)
        t1 = tl.now_us()
        if total:
            comm.dp.allreduce(buf, None, op=wire_op, dtype=dp_dtype)
        t2 = tl.now_us()
        for t, (a, b) in zip(group, spans):
            copy_out(t, buf[a:b], comm.size)
    t3 = tl.now_us()
    if comm.timeline:
        args = {"fused": len(group), "bytes": int(total * storage.itemsize)}
        for t in group:
            if not t.t_sent:  # agreed by the ranks' rounds: never negotiated
                comm.timeline.span(t.name, "queued", t.t_submit, t0)
            comm.timeline.span(t.name, "copy_in", t0, t1, args)
            comm.timeline.span(t.name, "allreduce", t1, t2, args)
            comm.timeline.span(t.name, "copy_out", t2, t3, args)


def copy_in(t: Tensor, dst: np.ndarray, rank: int) -> None:
    """dst (wire-typed, flat or the output itself) = ``rank``'s contribution of ``t``."""
    flat_dst = dst.reshape(-1)
    array = _data(t)[0]
    if t.kind == "broadcast":
        if rank == t.sig.root:
            if dst is not array:
                np.copyto(flat_dst, array.reshape(-1), casting="unsafe")
        else:
            flat_dst.fill(0)  # non-roots contribute zeros: the sum is the root's data
        return
    if dst is array and t.sig.prescale == 1.0:
        return
    scale_into(flat_dst, array.reshape(-1), t.sig.prescale, t.dtype, WIRE_DTYPE[t.dtype])


def result_factor(t: Tensor, size: int) -> float:
    """What ``t``'s sum is multiplied by on its way out: its postscale, and 1/size for
    an average (1.0 but for all-reduces)."""
    if t.kind != "allreduce":
        return 1.0
    return t.sig.postscale / size if t.op is ReduceOp.Average else t.sig.postscale


def engine_scale(comm: Any, t: Tensor, wire_op: str) -> float:
    """The factor to hand the data plane with ``t``'s message when ``t`` is reduced
    straight into its output (one tensor in its own dtype), 1.0 for none: a float32
    or float64 sum whose algorithm scales results as it copies them into place
    (``scales_results``, netreduce/algorithms/flat.py) gets its Average's 1/N and
    postscale there -- the same product numpy's multiply gives, without a second pass
    over the output after the all-reduce (issue 33, a rank's CPU per step). Every
    other algorithm gets 1.0: it refuses any other scale (algorithms/base.py)."""
    if wire_op != "sum" or t.dtype not in ("float32", "float64") or \
            not getattr(comm.dp, "scales_results", False):
        return 1.0
    return result_factor(t, comm.size)


def copy_out(t: Tensor, src: np.ndarray, size: int, scaled: bool = False) -> None:
    """``t``'s output = the reduced ``src``, with its postscale (and 1/size for an
    average) applied; ``scaled``: the data plane applied them already (engine_scale)."""
    factor = 1.0 if scaled else result_factor(t, size)
    output = _data(t)[1]
    if src is output and factor == 1.0:
        return
    scale_into(output.reshape(-1), src.reshape(-1), factor, t.dtype, WIRE_DTYPE[t.dtype])
