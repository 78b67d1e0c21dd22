"""The flat algorithm: every rank's whole buffer through the aggregator, one
connection (netreduce.dataplane.Connection) per rank. What netreduce did before the
hierarchical path; still the choice when every host runs one rank."""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np


class Flat:
    name = "flat"

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None) -> np.ndarray:
        return self.connection.allreduce(src, dst, op=op, dtype=dtype)

    def abort(self, reason: str) -> None:
        self.connection.abort(reason)

    def stats(self) -> Dict[str, Any]:
        return dict(self.connection.stats())

    def counters(self) -> Dict[str, Any]:
        return self.connection.counters()

    def close(self) -> None:
        self.connection.close()
