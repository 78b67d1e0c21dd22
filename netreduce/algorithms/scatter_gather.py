"""Reduce-scatter and all-gather over the algorithm's all-reduce.

The communicator's executor hands a fusion group of ``reducescatter`` or
``allgatherv`` tensors here (every rank runs the same group at the same log
position, so the data-plane messages below line up across ranks).

* reduce-scatter: the group's tensors are prescaled into one buffer laid out
  rank-major (each rank's rows of every tensor together; the first dimension split
  as Horovod splits it: the first ``rows % size`` ranks get a row more). Over the
  flat algorithm each rank's stretch is one owner-delivered message: every rank
  sends the whole buffer, the aggregator sends each stretch's sum to its owner only
  and a header-only notice to the others (docs/protocol.md, "Reduce-scatter"), so a
  rank receives S/N. Algorithms without ``reducescatter`` (hierarchical, several
  aggregators) all-reduce the whole buffer and keep the own stretch.
* all-gather: the first dimensions may differ by rank and are not in the
  negotiated signature, so one small exact sum (an int64 per rank and tensor, each
  rank writing its own column) tells every rank every row count; then each rank
  writes its rows at its offset in a zero buffer and the buffer is summed, which
  moves every value exactly (x + 0 is exact; -0.0 arrives as +0.0).
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from netreduce.ops import STORAGE, WIRE_DTYPE, ReduceOp, scale_into


def shard_rows(rows: int, size: int, rank: int):
    """(first row, row count) of ``rank``'s shard of ``rows`` rows."""
    base, extra = divmod(rows, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def _wire(t: Any):
    wire = WIRE_DTYPE[t.dtype]
    return wire, STORAGE[wire], ("bfloat16" if wire == "bfloat16" else None)


def run(comm: Any, group: List[Any]) -> None:
    if group[0].kind == "reducescatter":
        _reducescatter(comm, group)
    else:
        _allgather(comm, group)


def _reducescatter(comm: Any, group: List[Any]) -> None:
    """The group's tensors laid out rank-major: rank 0's rows of every tensor, then
    rank 1's, ... so that each rank's shards form one stretch, reduced as one
    owner-delivered message (or, over an algorithm without owner delivery, the
    whole buffer all-reduced)."""
    size, me = comm.size, comm.rank
    first = group[0]
    wire, storage, dp_dtype = _wire(first)
    wire_op = "sum" if first.op is ReduceOp.Average else first.op.wire
    # segments[q] = [(tensor, first element, elements)] of rank q's rows
    segments = []
    for q in range(size):
        row_segs = []
        for t in group:
            rows = t.array.shape[0]
            row = t.array.size // rows if rows else 0
            lo, count = shard_rows(rows, size, q)
            row_segs.append((t, lo * row, count * row))
        segments.append(row_segs)
    bounds, at = [], 0
    for q in range(size):
        start = at
        at += sum(n for _, _, n in segments[q])
        bounds.append((start, at))
    buf = np.empty(at, dtype=storage)
    at = 0
    for q in range(size):
        for t, a, n in segments[q]:
            scale_into(buf[at:at + n], t.array.reshape(-1)[a:a + n], t.sig.prescale, t.dtype, wire)
            at += n
    if buf.size:
        owner_delivery = getattr(comm.dp, "reducescatter", None)
        if owner_delivery is not None:
            owner_delivery(buf, bounds, op=wire_op, dtype=dp_dtype)
        else:
            comm.dp.allreduce(buf, None, op=wire_op, dtype=dp_dtype)
    at = bounds[me][0]
    for t, _, n in segments[me]:
        factor = t.sig.postscale / size if t.op is ReduceOp.Average else t.sig.postscale
        scale_into(t.output.reshape(-1), buf[at:at + n], factor, t.dtype, wire)
        at += n


def _allgather(comm: Any, group: List[Any]) -> None:
    size, rank = comm.size, comm.rank
    wire, storage, dp_dtype = _wire(group[0])
    rows = np.zeros((len(group), size), dtype=np.int64)
    for i, t in enumerate(group):
        rows[i, rank] = t.array.shape[0]
    comm.dp.allreduce(rows.reshape(-1), None, op="sum")
    per_row = [int(np.prod(t.array.shape[1:], dtype=np.int64)) for t in group]
    totals = [int(rows[i].sum()) * per_row[i] for i in range(len(group))]
    buf = np.zeros(sum(totals), dtype=storage)
    at = 0
    for i, t in enumerate(group):
        mine = at + int(rows[i, :rank].sum()) * per_row[i]
        scale_into(buf[mine:mine + t.array.size], t.array.reshape(-1), 1.0, t.dtype, wire)
        at += totals[i]
    if buf.size:
        comm.dp.allreduce(buf, None, op="sum", dtype=dp_dtype)
    at = 0
    for i, t in enumerate(group):
        out = np.empty((int(rows[i].sum()),) + t.array.shape[1:], dtype=t.array.dtype)
        scale_into(out.reshape(-1), buf[at:at + totals[i]], 1.0, t.dtype, wire)
        at += totals[i]
        t.output = out
        t.handle._outputs[t.index] = out
