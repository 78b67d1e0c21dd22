"""Reduce-scatter and all-gather over the algorithm's all-reduce.

The communicator's executor hands a fusion group of ``reducescatter`` or
``allgatherv`` tensors here (every rank runs the same group at the same log
position, so the data-plane messages below line up across ranks).

* reduce-scatter: the group's tensors are prescaled into one buffer, reduced
  through the aggregator, and each rank keeps its own rows of each tensor (the
  first dimension split as Horovod splits it: the first ``rows % size`` ranks get a
  row more). Every rank still receives the whole sum today: the owner-only delivery
  of docs/protocol.md ("Reduce-scatter") is not in the aggregator yet, so an
  algorithm that offers ``reducescatter(src, owner_bounds, ...)`` is used when
  present and this whole-buffer path is the fallback.
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
    first = group[0]
    wire, storage, dp_dtype = _wire(first)
    wire_op = "sum" if first.op is ReduceOp.Average else first.op.wire
    counts = [t.array.size for t in group]
    buf = np.empty(sum(counts), dtype=storage)
    at = 0
    for t, n in zip(group, counts):
        scale_into(buf[at:at + n], t.array.reshape(-1), t.sig[4], t.dtype, wire)
        at += n
    if buf.size:
        comm.dp.allreduce(buf, None, op=wire_op, dtype=dp_dtype)
    at = 0
    for t, n in zip(group, counts):
        rows = t.array.shape[0]
        row = n // rows if rows else 0
        lo, mine = shard_rows(rows, comm.size, comm.rank)
        factor = t.sig[5] / comm.size if t.op is ReduceOp.Average else t.sig[5]
        scale_into(t.output.reshape(-1), buf[at + lo * row:at + (lo + mine) * row], factor,
                   t.dtype, wire)
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
