"""Horovod's alltoall on numpy arrays, for every adapter: rows ``splits[r]`` of a
rank's array (consecutive, in rank order) go to rank r; each rank receives the rows
meant for it from every rank, in rank order, and how many came from each.

Relayed, not peer-to-peer: nothing in an alltoall reduces, and netreduce's ranks have
no paths to each other (every byte goes rank <-> aggregator), so every rank's send
rows and splits are all-gathered (two all-gathers submitted together, so negotiated
together) and each rank keeps its own rows. A rank receives N times what a
peer-to-peer alltoall would deliver: right for control-sized exchanges (routing
metadata of a mixture of experts, a model-parallel input shuffle), wrong for bulk.

The errors are Horovod's texts with Horovod's types: ValueError-based
InvalidArgumentError for bad splits (callers catch ValueError or RuntimeError), and
the all-gather's NegotiationError when ranks disagree on dtype or trailing shape.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from netreduce import api
from netreduce.errors import InvalidArgumentError


def check_splits(splits: Any, rows: int, size: int) -> np.ndarray:
    """``splits`` as an int32 vector of ``size`` entries (even split when None),
    or InvalidArgumentError with Horovod's message."""
    if splits is None:
        if rows % size:
            raise InvalidArgumentError(
                "splits not provided, but first dimension of tensor is not an even multiple "
                "of the number of workers.")
        return np.full(size, rows // size, dtype=np.int32)
    if isinstance(splits, np.ndarray):
        if splits.dtype != np.int32:
            raise InvalidArgumentError(
                "alltoall expects splits to contain 32-bit integer elements.")
        out = splits.reshape(-1)
    else:
        values = list(splits)
        if any(not isinstance(v, (int, np.integer)) or isinstance(v, bool) for v in values):
            raise InvalidArgumentError(
                "alltoall expects splits to contain 32-bit integer elements.")
        out = np.asarray(values, dtype=np.int32)
    if out.size != size:
        raise InvalidArgumentError("Number of entries in splits does not equal number of workers.")
    if (out < 0).any():
        raise InvalidArgumentError(
            f"alltoall: splits entries must not be negative, got {out.tolist()}")
    if int(out.sum()) > rows:
        raise InvalidArgumentError(
            "Sum of splits entries is greater than the first dimension of tensor.")
    return out


class AlltoallHandle:
    """The two all-gathers behind one alltoall; ``netreduce.poll`` / ``synchronize``
    take it like any handle. ``wait`` returns (received rows, received splits)."""

    def __init__(self, data: Any, splits: Any, rank: int, trailing: Tuple[int, ...],
                 dtype: np.dtype) -> None:
        self._data, self._splits, self._rank = data, splits, rank
        self._trailing, self._dtype = trailing, dtype
        self._result: Optional[Tuple[np.ndarray, np.ndarray]] = None

    def done(self) -> bool:
        return self._data.done() and self._splits.done()

    def wait(self, timeout: Optional[float] = None) -> Tuple[np.ndarray, np.ndarray]:
        if self._result is not None:
            return self._result
        error = None
        results: List[Any] = []
        for handle in (self._data, self._splits):  # both, so nothing is left in flight
            try:
                results.append(handle.wait(timeout))
            except Exception as exc:  # noqa: BLE001  re-raised below, first one wins
                error = error or exc
        if error is not None:
            raise error
        gathered, table = results
        table = table.astype(np.int64)      # row q: the splits rank q sent
        me = self._rank
        pieces, start = [], 0
        for q in range(table.shape[0]):
            offset = start + int(table[q, :me].sum())
            pieces.append(gathered[offset:offset + int(table[q, me])])
            start += int(table[q].sum())
        received = np.concatenate(pieces) if pieces else \
            np.empty((0,) + self._trailing, dtype=self._dtype)
        self._result = (received, table[:, me].astype(np.int32))
        return self._result


def alltoall_async(array: np.ndarray, splits: Any = None, name: Optional[str] = None, *,
                   dtype: Optional[str] = None) -> AlltoallHandle:
    """Start an alltoall of ``array`` (first dimension split by ``splits``, an int32
    vector of size() entries, or evenly); a 0-d array counts as one row."""
    array = np.asarray(array)
    if array.ndim == 0:
        array = array.reshape(1)
    n = api.size()
    mine = check_splits(splits, int(array.shape[0]), n)
    send = array[:int(mine.sum())]
    data = api.allgather_async(send, name=f"{name}.data" if name else None, dtype=dtype)
    table = api.allgather_async(mine.reshape(1, n), name=f"{name}.splits" if name else None)
    return AlltoallHandle(data, table, api.rank(), tuple(array.shape[1:]), array.dtype)


def alltoall(array: np.ndarray, splits: Any = None, name: Optional[str] = None, *,
             dtype: Optional[str] = None) -> Tuple[np.ndarray, np.ndarray]:
    """(rows received from every rank in rank order, how many from each)."""
    return alltoall_async(array, splits, name, dtype=dtype).wait()
