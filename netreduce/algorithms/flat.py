"""The flat algorithm: every rank's whole buffer through the aggregator, one
connection (netreduce.worker.dataplane.Connection) per rank. What netreduce did before the
hierarchical path; still the choice when every host runs one rank."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np


# Connection.allreduce_async's owner for a chunk-interleaved reduce-scatter message.
INTERLEAVED_OWNERS = -2


class Flat:
    name = "flat"
    # Reduce-scatter stretches chunk-interleaved (False: one message per owner, in
    # rank order; benchmarks/collectives.py compares the two).
    interleave = True
    # allreduce(..., scale=f) and allreduce_async(..., scale=f) deliver a float32 or
    # float64 sum times f, scaled by the engine as it copies each result into place
    # (Connection.allreduce_async): the Average's divide without a pass of its own
    # (group_message.engine_scale). Only this algorithm says so; the others refuse a
    # scale (base.unscaled) and their results are scaled afterwards, in Python.
    scales_results = True

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None, scale: float = 1.0) -> np.ndarray:
        return self.connection.allreduce(src, dst, op=op, dtype=dtype, scale=scale)

    def allreduce_async(self, src: np.ndarray, dst: Optional[np.ndarray] = None,
                        op: str = "sum", dtype: Optional[str] = None, scale: float = 1.0) -> Any:
        """allreduce() handed to the engine, which runs its requests in the order
        submitted; the request's wait() returns ``dst`` (agreed groups in flight,
        netreduce/worker/pipeline.py). ``scale``: see ``scales_results``."""
        return self.connection.allreduce_async(src, dst, op=op, dtype=dtype, scale=scale)

    @property
    def vote_step(self) -> Optional[Callable[..., int]]:
        """The connection's steady step in one native call (Speculation.run_lone),
        where it has one."""
        return getattr(self.connection, "vote_step", None)

    def reducescatter(self, src: np.ndarray, bounds: Sequence[Tuple[int, int]], op: str = "sum",
                      dtype: Optional[str] = None) -> None:
        """Reduce ``src`` in place with owner delivery: ``bounds[r]`` = (start, stop)
        of rank r's stretch, whose sum only rank r receives (docs/protocol.md,
        "Reduce-scatter"); the other stretches of this rank's ``src`` keep its own
        contribution. The stretches' first k whole chunks each (k the shortest
        stretch's) go as one message laid out chunk-interleaved (chunk c of it belongs
        to rank c mod N), so that every window of slots carries every rank's data and
        no rank's link idles while the others send its stretch; the rest of each
        stretch, and stretches under two chunks, as one message per owner, queued
        right behind."""
        conn = self.connection
        n = len(bounds)
        width = 4 if dtype == "bfloat16" or src.dtype == np.float16 else src.dtype.itemsize
        chunk = conn.chunk_elements(width)
        k = min((b - a for a, b in bounds), default=0) // chunk if chunk else 0
        inter = None
        reqs = []
        if self.interleave and n >= 2 and k >= 2:
            inter = np.empty((k, n, chunk), dtype=src.dtype)  # [chunk of a stretch, owner]
            for q, (a, _) in enumerate(bounds):
                inter[:, q, :] = src[a:a + k * chunk].reshape(k, chunk)
            reqs.append(conn.allreduce_async(inter.reshape(-1), None, op=op, dtype=dtype,
                                             owner=INTERLEAVED_OWNERS))
        else:
            k = 0
        reqs += [conn.allreduce_async(src[a + k * chunk:b], None, op=op, dtype=dtype, owner=r)
                 for r, (a, b) in enumerate(bounds) if b > a + k * chunk]
        for req in reqs:
            req.wait()
        if inter is not None:
            a = bounds[conn.rank][0]
            src[a:a + k * chunk] = inter[:, conn.rank, :].reshape(-1)

    def abort(self, reason: str) -> None:
        self.connection.abort(reason)

    def stats(self) -> Dict[str, Any]:
        return dict(self.connection.stats())

    def counters(self) -> Dict[str, Any]:
        return self.connection.counters()

    def close(self) -> None:
        self.connection.close()
