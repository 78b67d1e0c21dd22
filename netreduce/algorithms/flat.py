"""The flat algorithm: every rank's whole buffer through the aggregator, one
connection (netreduce.dataplane.Connection) per rank. What netreduce did before the
hierarchical path; still the choice when every host runs one rank."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np


class Flat:
    name = "flat"

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None) -> np.ndarray:
        return self.connection.allreduce(src, dst, op=op, dtype=dtype)

    def reducescatter(self, src: np.ndarray, bounds: Sequence[Tuple[int, int]], op: str = "sum",
                      dtype: Optional[str] = None) -> None:
        """Reduce ``src`` in place with owner delivery: ``bounds[r]`` = (start, stop)
        of rank r's stretch, whose sum only rank r receives (docs/protocol.md,
        "Reduce-scatter"); the other stretches of this rank's ``src`` keep its own
        contribution. One message per rank, queued back to back."""
        reqs = [self.connection.allreduce_async(src[a:b], None, op=op, dtype=dtype, owner=r)
                for r, (a, b) in enumerate(bounds) if b > a]
        for req in reqs:
            req.wait()

    def abort(self, reason: str) -> None:
        self.connection.abort(reason)

    def stats(self) -> Dict[str, Any]:
        return dict(self.connection.stats())

    def counters(self) -> Dict[str, Any]:
        return self.connection.counters()

    def close(self) -> None:
        self.connection.close()
