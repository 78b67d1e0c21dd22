"""Tensor fusion: many small tensors become one data-plane message.

A data-plane all-reduce has a fixed cost (a round of the slot window, a wakeup of the
engine thread) that dwarfs the time to move a 1 KiB bias. Horovod's answer, kept
here: tensors that are ready together and travel with the same dtype and wire op are
copied into one preallocated buffer, reduced as one message, and copied back out.

Two halves: ``plan`` (run by the coordinator, so that every rank cuts the same groups
— the data plane requires identical message sizes in identical order on all ranks)
and ``FusionBuffer`` (run by each rank, allocated once and reused for every group).
"""
from __future__ import annotations

from typing import Dict, Hashable, List, Sequence, Tuple

import numpy as np


def plan(items: Sequence[Tuple[Hashable, Hashable, int]], threshold: int) -> List[List[int]]:
    """Group ``items`` (key, fusion key, nbytes), given in ready order, into fusion
    groups; returns lists of indices into ``items``.

    Items of one fusion key share a group in ready order until the next would push it
    past ``threshold`` bytes; a key of None never fuses (barriers). The groups come out
    ordered by their first member, so a rank executes them in the order the tensors
    became ready. An item larger than the threshold gets a group of its own (and is
    reduced in place, without the buffer).
    """
    groups: List[List[int]] = []
    open_group: Dict[Hashable, Tuple[int, int]] = {}  # fusion key -> (group index, bytes)
    for i, (_, fkey, nbytes) in enumerate(items):
        if fkey is None or nbytes > threshold:
            groups.append([i])
            continue
        slot = open_group.get(fkey)
        if slot is not None and slot[1] + nbytes <= threshold:
            groups[slot[0]].append(i)
            open_group[fkey] = (slot[0], slot[1] + nbytes)
        else:
            open_group[fkey] = (len(groups), nbytes)
            groups.append([i])
    return groups


class FusionBuffer:
    """One contiguous byte buffer of ``capacity`` bytes, allocated on first use and
    never again (``allocations`` counts that, and tests check it stays 1)."""

    # Tensors are packed back to back in elements, with no alignment padding: the data
    # plane reduces one dense array of one dtype, and padding would be wire traffic.

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self._raw: np.ndarray = np.empty(0, dtype=np.uint8)
        self.allocations = 0

    def view(self, dtype: np.dtype, count: int) -> np.ndarray:
        """A flat ``dtype`` view of the first ``count`` elements."""
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes > self.capacity:
            raise ValueError(f"fusion group of {nbytes} bytes exceeds the fusion buffer "
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
