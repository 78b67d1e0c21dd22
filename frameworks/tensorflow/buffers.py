"""numpy arrays <-> the netreduce core: the only place the TensorFlow adapter calls the
core's collectives. Framework-free numpy, used two ways:

* eagerly, ``call(...).wait()`` on the calling thread (mpi_ops.py);
* by the graph op's bridge (op_bridge.py), which submits the same call and gets its
  results through ``Pending.when_done`` on the core thread that completes it — no
  thread waits.

Every function submits without waiting and returns a ``Pending``: the core handles
of one adapter call and how their results become the call's arrays. With
``inplace=True`` the core may write its results into the given arrays (the graph
op's outputs, which start as a copy of the inputs); results that could not be
written there (bool, widened for the trip) are new arrays.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from netreduce import api as _api
from netreduce.worker import process_sets as _ps
from netreduce.errors import InvalidArgumentError
from netreduce.ops import as_op


class Pending:
    """One adapter call in flight: its core handles and ``finish`` (their results, in
    handle order, -> the call's result). ``error``: a submission that failed after
    others of the same call had started; the call fails with it, but only once
    those have finished (the core may still be writing into the call's buffers)."""

    __slots__ = ("handles", "finish", "error")

    def __init__(self, handles: Sequence[Any], finish: Callable[[List[Any]], Any],
                 error: Optional[BaseException] = None):
        self.handles, self.finish, self.error = list(handles), finish, error

    def wait(self) -> Any:
        results = []
        for h in self.handles:
            try:
                results.append(h.wait())
            except Exception:
                if self.error is None:
                    raise
        if self.error is not None:
            raise self.error
        return self.finish(results)

    def when_done(self, fn: Callable[[Any, Optional[BaseException]], None]) -> None:
        """``fn(result, None)`` or ``fn(None, error)`` once every handle has finished,
        on the thread that finished the last one (or this one, if all have)."""
        left = [len(self.handles)]
        lock = threading.Lock()

        def one_done(_handle) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            try:
                result = self.wait()  # every handle is done: returns at once
            except Exception as exc:
                fn(None, exc)
                return
            fn(result, None)
        if not self.handles:
            if self.error is not None:
                fn(None, self.error)
            else:
                fn(self.finish([]), None)
            return
        for h in self.handles:
            h.add_done_callback(one_done)


def _start_all(starts: Sequence[Callable[[], Any]], finish: Callable[[List[Any]], Any]
               ) -> Pending:
    """Run the submissions in order; one that fails after others started becomes the
    Pending's error (a first one that fails raises: nothing is in flight)."""
    handles: List[Any] = []
    for start in starts:
        try:
            handles.append(start())
        except Exception as exc:
            if not handles:
                raise
            return Pending(handles, finish, error=exc)
    return Pending(handles, finish)


def _to_core(a: np.ndarray, same_shape: bool = True):
    """(array the core reads, core kwargs, function turning a core result back: into
    ``a``'s shape when the result has it — all-reduce, broadcast — else the core's)."""
    shape = np.shape(a)  # np.ascontiguousarray makes 0-d arrays 1-d
    a = np.ascontiguousarray(a)

    def shaped(r: np.ndarray) -> np.ndarray:
        return r.reshape(shape) if same_shape else r
    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: the core takes its bit pattern
        return a.view(np.uint16), {"dtype": "bfloat16"}, lambda r: shaped(r.view(a.dtype))
    if a.dtype == np.bool_:  # only moved (broadcast/allgather/alltoall), never reduced
        return a.astype(np.int32), {}, lambda r: shaped(r.astype(np.bool_))
    return a, {}, shaped


def _check_reducible(arrays: Sequence[np.ndarray], name: Optional[str], what: str) -> None:
    for i, a in enumerate(arrays):
        if a.dtype == np.bool_:
            label = f"{name}.{i}" if name else f"#{i}"
            raise InvalidArgumentError(f"{what}: tensor {label!r} has dtype bool, which "
                                       "netreduce cannot reduce (cast it to an integer type)")


def _by_dtype_hint(prepared) -> List[List[int]]:
    """Indices grouped by core dtype hint (the core takes one per submission)."""
    groups = {}
    for i, p in enumerate(prepared):
        groups.setdefault(p[1].get("dtype", ""), []).append(i)
    return list(groups.values())


def _label(name: Optional[str], part: int, parts: int) -> Optional[str]:
    if name is None or parts == 1:
        return name
    return f"{name}.p{part}"


def _grouped(submit: Callable[..., Any], arrays: Sequence[np.ndarray], name: Optional[str],
             same_shape: bool) -> Pending:
    """Submit ``arrays`` as grouped core calls, one per dtype hint (bfloat16 apart),
    and return the results in the input order, each turned back by _to_core."""
    prepared = [_to_core(a, same_shape) for a in arrays]
    groups = _by_dtype_hint(prepared)
    def finish(results):
        out: List[Any] = [None] * len(arrays)
        for idx, res in zip(groups, results):
            for i, r in zip(idx, res):
                out[i] = prepared[i][2](r)
        return out
    return _start_all([lambda k=k, idx=idx: submit([prepared[i][0] for i in idx],
                                                   _label(name, k, len(groups)),
                                                   prepared[idx[0]][1])
                       for k, idx in enumerate(groups)], finish)


# --- collectives ---------------------------------------------------------------------------
def allreduce(arrays: Sequence[np.ndarray], name: Optional[str], op: Any,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              inplace: bool = False) -> Pending:
    """All-reduce several arrays as one core submission (bfloat16 ones as another)."""
    op = as_op(op)
    _check_reducible(arrays, name, "allreduce")
    scales = dict(prescale_factor=float(prescale_factor), postscale_factor=float(postscale_factor))
    return _grouped(lambda xs, label, kw: _api.grouped_allreduce_async(
        xs, op=op, name=label, inplace=inplace, **scales, **kw), arrays, name, True)


def broadcast(arrays: Sequence[np.ndarray], root_rank: int, name: Optional[str],
              inplace: bool = False) -> Pending:
    """root_rank's arrays on every rank, submitted together."""
    prepared = [_to_core(a) for a in arrays]
    return _start_all([lambda i=i, p=p: _api.broadcast_async(
        p[0], root_rank, None if name is None else f"{name}.{i}", inplace=inplace, **p[1])
        for i, p in enumerate(prepared)],
        lambda results: [p[2](r) for p, r in zip(prepared, results)])


def allgather(arrays: Sequence[np.ndarray], name: Optional[str]) -> Pending:
    """Every rank's arrays concatenated along the first dimension (which may differ by
    rank; the others must agree), one grouped core call (a 0-d array counts as one row)."""
    arrays = [np.reshape(a, (1,)) if np.ndim(a) == 0 else a for a in arrays]
    return _grouped(lambda xs, label, kw: _api.grouped_allgather_async(xs, name=label, **kw),
                    arrays, name, False)


def reducescatter(arrays: Sequence[np.ndarray], name: Optional[str], op: Any,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Pending:
    """This rank's rows of the reduction of each array (same shape on every rank; the
    first dimension split as Horovod splits it)."""
    op = as_op(op)
    _check_reducible(arrays, name, "reducescatter")
    for a in arrays:
        if np.ndim(a) == 0:
            raise InvalidArgumentError("Reducescatter does not support scalar inputs")
    scales = dict(prescale_factor=float(prescale_factor), postscale_factor=float(postscale_factor))
    return _grouped(lambda xs, label, kw: _api.grouped_reducescatter_async(
        xs, op=op, name=label, **scales, **kw), arrays, name, False)


def check_splits(rows: int, splits: Optional[Union[np.ndarray, Sequence[int]]],
                 size: int) -> np.ndarray:
    """Horovod's alltoall splits rules (errors with Horovod's messages), as int32."""
    if splits is None or np.size(splits) == 0:
        if rows % size:
            raise InvalidArgumentError("splits not provided, but first dimension of tensor is "
                                       "not an even multiple of the number of workers.")
        return np.full(size, rows // size, dtype=np.int32)
    splits = np.asarray(splits)
    if splits.dtype != np.int32:
        raise InvalidArgumentError("alltoall expects splits to contain 32-bit integer elements.")
    splits = splits.reshape(-1)
    if splits.size != size:
        raise InvalidArgumentError("Number of entries in splits does not equal number of "
                                   "workers.")
    if (splits < 0).any():
        raise InvalidArgumentError(f"alltoall: splits entries must not be negative, got "
                                   f"{splits.tolist()}")
    if int(splits.sum()) > rows:
        raise InvalidArgumentError("Sum of splits entries is greater than the first dimension "
                                   "of tensor.")
    return splits


def alltoall(array: np.ndarray, splits: Optional[np.ndarray], name: Optional[str]
             ) -> Pending:
    """Rows ``splits[r]`` (consecutive, in rank order) of ``array`` to rank r; the result
    is (received rows in rank order, received splits as int32).

    Relayed through the aggregator: ranks have no paths to each other in netreduce
    (every byte goes rank <-> aggregator) and alltoall has nothing to reduce, so every
    rank's rows and splits are all-gathered and each rank keeps the rows meant for it:
    each rank receives N times what a peer-to-peer alltoall would deliver."""
    size, me = _api.size(), _api.rank()
    array = np.reshape(array, (1,)) if np.ndim(array) == 0 else array
    mine = check_splits(array.shape[0], splits, size)
    rows = int(mine.sum())
    data = _grouped(lambda xs, label, kw: _api.grouped_allgather_async(xs, name=label, **kw),
                    [array[:rows]], None if name is None else f"{name}.data", False)
    if data.error is not None:
        return data
    try:
        counts = _api.allgather_async(mine.reshape(1, -1),
                                      name=None if name is None else f"{name}.splits")
    except Exception as exc:  # the rows are on their way: fail once they have arrived
        return Pending(data.handles, data.finish, error=exc)

    def finish(results: List[Any]) -> Tuple[np.ndarray, np.ndarray]:
        gathered = data.finish(results[:-1])[0]
        every = results[-1].astype(np.int64)  # [rank q][destination r]
        starts = np.concatenate([[0], np.cumsum(every.sum(axis=1))])
        pieces = [gathered[starts[q] + every[q, :me].sum():][:every[q, me]] for q in range(size)]
        received = np.concatenate(pieces) if pieces else gathered[:0]
        return received, every[:, me].astype(np.int32)
    return Pending(data.handles + [counts], finish)


# --- one entry point for both paths ----------------------------------------------------------
def spec(kind: str, name: Optional[str], op: Any = None, prescale_factor: float = 1.0,
         postscale_factor: float = 1.0, root_rank: int = -1, process_set_id: Any = 0
         ) -> Dict[str, Any]:
    """What one call does, as plain data: the graph op carries it as JSON (its ``spec``
    attribute), the eager path hands it to ``submit`` directly."""
    return {"k": kind, "n": name, "op": None if op is None else as_op(op).value,
            "pre": float(prescale_factor), "post": float(postscale_factor),
            "root": int(root_rank), "ps": process_set_id}


def submit(call: Dict[str, Any], arrays: Sequence[np.ndarray], inplace: bool = False,
           splits: Optional[np.ndarray] = None) -> Pending:
    """Start ``call`` (from ``spec``) on ``arrays``, on its process set."""
    kind, name = call["k"], call["n"]
    with _ps.using(_ps.lookup(call["ps"])):
        if kind == "allreduce":
            return allreduce(arrays, name, call["op"], call["pre"], call["post"], inplace)
        if kind == "broadcast":
            return broadcast(arrays, call["root"], name, inplace)
        if kind == "allgather":
            return allgather(arrays, name)
        if kind == "reducescatter":
            return reducescatter(arrays, name, call["op"], call["pre"], call["post"])
        if kind == "alltoall":
            return alltoall(arrays[0], splits, name)
    raise InvalidArgumentError(f"netreduce.tensorflow: unknown collective {kind!r}")
