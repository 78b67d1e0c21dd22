"""How tensors are cut into fusion groups: the one rule every side applies alike.

A data-plane all-reduce has a fixed cost (a round of the slot window, a wakeup of the
engine thread) that dwarfs the time to move a 1 KiB bias. Horovod's answer, kept
here: tensors that are ready together and travel with the same dtype and wire op are
reduced as one message. The data plane requires identical message sizes in
identical order on all ranks, so the cut is a pure function of the ready list: the
coordinator (netreduce/switch/coordinator.py) applies it to the negotiated log, the
ranks' own agreement (netreduce/worker/agreement.py) to the ids they agreed on.
Each rank's side — copying a group into one buffer and back — is
netreduce/worker/fusion_buffer.py.
"""
from __future__ import annotations

from typing import Dict, Hashable, List, Sequence, Tuple


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
