"""Tensor fusion, a rank's side: many small tensors become one data-plane message.

The groups are cut by netreduce/protocol/fusion.py (the same cut on every rank);
``FusionBuffer`` is where a group's tensors are copied in, reduced as one message,
and copied back out: allocated once and reused for every group.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from netreduce.errors import InvalidArgumentError


class FusionBuffer:
    """One contiguous byte buffer of ``capacity`` bytes, allocated on first use and
    never again (``allocations`` counts that, and tests check it stays 1). With
    ``grow``, no capacity: as large as the largest view asked for so far (the
    pipeline's buffers, netreduce/worker/pipeline.py, hold only the small tensors of
    a group)."""

    # Tensors are packed back to back in elements, with no alignment padding: the data
    # plane reduces one dense array of one dtype, and padding would be wire traffic.

    def __init__(self, capacity: int, grow: bool = False) -> None:
        self.capacity = int(capacity)
        self.grow = grow
        self._raw: np.ndarray = np.empty(0, dtype=np.uint8)
        self.allocations = 0

    def view(self, dtype: np.dtype, count: int) -> np.ndarray:
        """A flat ``dtype`` view of the first ``count`` elements."""
        nbytes = count * np.dtype(dtype).itemsize
        if self.grow:
            if nbytes > self._raw.size:
                self._raw = np.empty(nbytes, dtype=np.uint8)
                self.allocations += 1
            return self._raw[:nbytes].view(dtype)
        if nbytes > self.capacity:
            raise InvalidArgumentError(f"fusion group of {nbytes} bytes exceeds the fusion buffer "
                             f"({self.capacity} bytes)")
        if self._raw.size == 0 and self.capacity > 0:
            self._raw = np.empty(self.capacity, dtype=np.uint8)
            self.allocations += 1
        return self._raw[:nbytes].view(dtype)

    @staticmethod
    def offsets(counts: Sequence[int]) -> List[Tuple[int, int]]:
        """(start, stop) element ranges of tensors packed back to back."""
        spans, start = [], 0
        for n in counts:
            spans.append((start, start + n))
            start += n
        return spans
