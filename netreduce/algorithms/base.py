"""The interface every algorithm implements: what netreduce.communicator calls."""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

try:  # typing.Protocol is 3.8+; kept structural so that Connection itself fits
    from typing import Protocol
except ImportError:  # pragma: no cover
    Protocol = object  # type: ignore


class Algorithm(Protocol):
    name: str

    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None) -> np.ndarray:
        """Reduce ``src`` across every rank into ``dst`` (``src`` itself when None);
        every rank ends with the same bytes. Releases the GIL while it waits."""

    def abort(self, reason: str) -> None:
        """Fail the running and every later call (any thread)."""

    def stats(self) -> Dict[str, Any]:
        """Counters of the data plane(s) underneath."""

    def close(self) -> None:
        """Release everything; closing twice is harmless."""
