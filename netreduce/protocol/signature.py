"""A tensor's negotiation signature (kind, dtype, shape, op, scales, root): how the
coordinator compares what ranks submitted, words a mismatch the way Horovod does,
and keys fusion; netreduce/switch/coordinator.py and netreduce/worker/response_cache.py
use it."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from netreduce.ops import STORAGE, WIRE_DTYPE

# Signature fields, in the order mismatches are reported (Horovod checks the
# operation first: a shape comparison between an allreduce and a broadcast is moot).
FIELDS = ("kind", "dtype", "shape", "op", "prescale", "postscale", "root")
Sig = Tuple[str, str, Tuple[int, ...], str, float, float, int]


def sig_of(req: Dict[str, Any]) -> Sig:
    return (str(req["k"]), str(req["d"]), tuple(int(x) for x in req["s"]), str(req["o"]),
            float(req.get("pre", 1.0)), float(req.get("post", 1.0)), int(req.get("r", -1)))


def _article(kind: str) -> str:
    return ("an " if kind[:1] in "aeiou" else "a ") + kind


def _fmt(field: str, value: Any) -> str:
    return str(list(value)) if field == "shape" else str(value)


def mismatch_message(name: str, sigs: Dict[int, Sig]) -> Optional[str]:
    """Horovod's wording for the first field on which the ranks disagree, plus the
    tensor name and which ranks sent which value; None when all agree."""
    for i, field in enumerate(FIELDS):
        by_value: Dict[Any, List[int]] = {}
        for rank in sorted(sigs):
            by_value.setdefault(sigs[rank][i], []).append(rank)
        if len(by_value) < 2:
            continue
        (a, ranks_a), (b, ranks_b) = list(by_value.items())[:2]
        fa, fb = _fmt(field, a), _fmt(field, b)
        kind = sigs[min(sigs)][0].replace("allgatherv", "allgather")
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
    kind, dtype, _, op = sig[:4]
    if kind in ("barrier", "join"):
        return None
    wire_op = "sum" if kind == "broadcast" or op == "average" else op
    if kind in ("reducescatter", "allgatherv"):  # executed apart (algorithms/scatter_gather)
        return (kind, WIRE_DTYPE.get(dtype, dtype), wire_op)
    return (WIRE_DTYPE.get(dtype, dtype), wire_op)


def nbytes(sig: Sig) -> int:
    if sig[0] in ("barrier", "join"):
        return 0
    count = int(np.prod(sig[2], dtype=np.int64)) if sig[2] else 1
    return count * STORAGE[WIRE_DTYPE[sig[1]]].itemsize


def sig_request(name: str, sig: Sig) -> Dict[str, Any]:
    """A signature as a request dict (what ``sig_of`` reads back): how a log entry
    tells a joined rank the tensors it contributes zeros to."""
    req: Dict[str, Any] = {"n": name, "k": sig[0], "d": sig[1], "s": list(sig[2]),
                           "o": sig[3]}
    if sig[4] != 1.0:
        req["pre"] = sig[4]
    if sig[5] != 1.0:
        req["post"] = sig[5]
    if sig[6] >= 0:
        req["r"] = sig[6]
    return req
