"""A tensor's negotiation signature (kind, dtype, shape, op, scales, root): how the
coordinator compares what ranks submitted, words a mismatch the way Horovod does,
and keys fusion; netreduce/switch/coordinator.py and netreduce/worker/agreement.py
use it."""
from __future__ import annotations

import math
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from netreduce.dtypes import WIRE_DTYPE, WIRE_ITEMSIZE

class Signature(NamedTuple):
    """What every rank must submit alike for a tensor name. A tuple still (a plain
    7-tuple of the same values compares and hashes equal); read it by name."""
    kind: str                  # allreduce, broadcast, allgather(v), reducescatter, barrier, join
    dtype: str                 # numpy's name (bfloat16 too)
    shape: Tuple[int, ...]
    op: str                    # ReduceOp's value; "" where the kind has none
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1             # broadcast's root rank; -1 otherwise


# In the order mismatches are reported (Horovod checks the operation first: a shape
# comparison between an allreduce and a broadcast is moot).
FIELDS = Signature._fields
Sig = Signature  # the old name


def _article(kind: str) -> str:
    return ("an " if kind[:1] in "aeiou" else "a ") + kind


def _fmt(field: str, value: Any) -> str:
    return str(list(value)) if field == "shape" else str(value)


def mismatch_message(name: str, sigs: Dict[int, Sig]) -> Optional[str]:
    """Horovod's wording for the first field on which the ranks disagree, plus the
    tensor name and which ranks sent which value; None when all agree."""
    for field in FIELDS:
        by_value: Dict[Any, List[int]] = {}
        for rank in sorted(sigs):
            by_value.setdefault(getattr(sigs[rank], field), []).append(rank)
        if len(by_value) < 2:
            continue
        (a, ranks_a), (b, ranks_b) = list(by_value.items())[:2]
        fa, fb = _fmt(field, a), _fmt(field, b)
        kind = sigs[min(sigs)].kind.replace("allgatherv", "allgather")
        head = {
            "kind": f"Mismatched operations: One rank did {_article(fa)}, "
                    f"but another rank did {_article(fb)}.",
            "dtype": f"Mismatched data types: One rank had type {fa}, "
                     f"but another rank had type {fb}.",
            "shape": f"Mismatched {kind} tensor shapes: One rank sent a tensor of shape {fa}, "
                     f"but another rank sent a tensor of shape {fb}.",
            "op": f"Mismatched {kind} reduction ops: One rank sent op {fa}, "
                  f"but another rank sent op {fb}.",
            "prescale": f"Mismatched prescale factors: One rank sent factor {fa}, "
                        f"but another rank sent factor {fb}.",
            "postscale": f"Mismatched postscale factors: One rank sent factor {fa}, "
                         f"but another rank sent factor {fb}.",
            "root": f"Mismatched broadcast root ranks: One rank specified root rank {fa}, "
                    f"but another rank specified root rank {fb}.",
        }[field]
        detail = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))} "
                           f"sent {_fmt(field, v)}" for v, r in by_value.items())
        return f"{head} Tensor '{name}': {detail}."
    return None


def fusion_key(sig: Sig) -> Optional[Tuple[str, str]]:
    """Tensors with equal keys may share a data-plane message: same wire dtype and wire
    op. Average and broadcast are sums on the wire (broadcast: non-roots send zeros)."""
    kind, dtype, op = sig.kind, sig.dtype, sig.op
    if kind in ("barrier", "join"):
        return None
    wire_op = "sum" if kind == "broadcast" or op == "average" else op
    if kind in ("reducescatter", "allgatherv"):  # executed apart (algorithms/scatter_gather)
        return (kind, WIRE_DTYPE.get(dtype, dtype), wire_op)
    return (WIRE_DTYPE.get(dtype, dtype), wire_op)


def nbytes(sig: Sig) -> int:
    if sig.kind in ("barrier", "join"):
        return 0
    # math.prod, not numpy's: the executor calls this per tensor per round, and a numpy
    # reduction over a short tuple costs ~3 µs; () -> 1, as before
    return int(math.prod(sig.shape)) * WIRE_ITEMSIZE[WIRE_DTYPE[sig.dtype]]
