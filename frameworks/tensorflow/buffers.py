"""numpy arrays <-> the netreduce core: the only place the TensorFlow adapter calls the
core's collectives. Everything here is framework-free numpy, run eagerly or as the body
of a tf.numpy_function node (mpi_ops.run_numpy)."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

import netreduce as _nr
from netreduce.errors import InvalidArgumentError, NetReduceError
from netreduce.ops import Sum, as_op


def _to_core(a: np.ndarray):
    """(array the core reads, core kwargs, function turning a core result back)."""
    shape = np.shape(a)  # np.ascontiguousarray makes 0-d arrays 1-d
    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: the core takes its bit pattern
        return a.view(np.uint16), {"dtype": "bfloat16"}, \
            lambda r: r.view(a.dtype).reshape(shape)
    if a.dtype == np.bool_:  # only moved (broadcast/allgather), never reduced
        return a.astype(np.int32), {}, lambda r: r.astype(np.bool_).reshape(shape)
    return a, {}, lambda r: r.reshape(shape)


def _check_reducible(arrays: Sequence[np.ndarray], names: Sequence[str]) -> None:
    for a, n in zip(arrays, names):
        if a.dtype == np.bool_:
            raise InvalidArgumentError(f"allreduce: tensor {n!r} has dtype bool, which netreduce "
                             "cannot reduce (cast it to an integer type)")


def reduce_arrays(arrays: Sequence[np.ndarray], name: Optional[str], op: Any,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> List[np.ndarray]:
    """All-reduce numpy arrays as one core submission (bfloat16 ones as a second
    group: the core takes one dtype hint per group)."""
    op = as_op(op)
    _check_reducible(arrays, [f"{name or 'allreduce'}.{i}" for i in range(len(arrays))])
    prepared = [_to_core(a) for a in arrays]
    scales = dict(prescale_factor=float(prescale_factor), postscale_factor=float(postscale_factor))
    parts = {}
    for tag in ("", "bf16"):
        idx = [i for i, p in enumerate(prepared) if bool(p[1]) == (tag == "bf16")]
        if idx:
            label = None if name is None else (f"{name}.{tag}" if tag else name)
            handle = _nr.grouped_allreduce_async([prepared[i][0] for i in idx], op=op,
                                                 name=label, **scales,
                                                 **(prepared[idx[0]][1]))
            parts[tag] = (idx, handle)
    out: List[Any] = [None] * len(arrays)
    for idx, handle in parts.values():
        for i, r in zip(idx, _nr.synchronize(handle)):
            out[i] = prepared[i][2](r)
    return out


def broadcast_arrays(arrays: Sequence[np.ndarray], root_rank: int,
                     name: Optional[str]) -> List[np.ndarray]:
    """Broadcast several arrays, submitted together and waited for at the end."""
    prepared = [_to_core(a) for a in arrays]
    handles = [_nr.broadcast_async(p[0], root_rank, None if name is None else f"{name}.{i}",
                                   **p[1]) for i, p in enumerate(prepared)]
    return [p[2](_nr.synchronize(h)) for p, h in zip(prepared, handles)]


def allgather_array(a: np.ndarray, name: Optional[str]) -> np.ndarray:
    """Concatenate every rank's ``a`` along axis 0 (first dims may differ). Each rank
    writes its rows into its own stretch of a zero buffer and the buffers are summed
    through the aggregator, which moves every value exactly (-0.0 arrives as +0.0)."""
    rows = a.shape[0] if np.ndim(a) else 1
    a = np.ascontiguousarray(a)
    a = a.reshape((rows,) + a.shape[1:])
    meta = _nr.allgather_object((rows, a.shape[1:], a.dtype.name),
                                name=None if name is None else f"{name}.meta")
    if len({m[1:] for m in meta}) != 1:
        raise NetReduceError(f"allgather: tensor {name or '(unnamed)'!r} has mismatched "
                             "trailing shapes or dtypes: "
                             + ", ".join(f"rank {r}: {m[1]} {m[2]}" for r, m in enumerate(meta)))
    start = sum(m[0] for m in meta[:_nr.rank()])
    padded = np.zeros((sum(m[0] for m in meta),) + a.shape[1:], dtype=a.dtype)
    padded[start:start + rows] = a
    core, kwargs, back = _to_core(padded)
    result = _nr.allreduce(core, op=Sum, name=None if name is None else f"{name}.data", **kwargs)
    return back(result)
