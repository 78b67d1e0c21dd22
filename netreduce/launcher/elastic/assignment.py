"""Ranks for the hosts of one membership epoch (Horovod's get_host_assignments).

Hosts in their assignment order (oldest first), each filled up to its slots, until
``--max-np``: rank r is the r-th slot so filled, local rank its slot on its host,
cross rank its host's position among the hosts that have that local rank. A worker
process is named by (host, slot) for its whole life: when a later epoch keeps the
slot, the same process gets the slot's new rank."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class Slot:
    host: str
    local_rank: int
    rank: int
    size: int
    local_size: int
    cross_rank: int
    cross_size: int

    @property
    def name(self) -> str:
        return worker_name(self.host, self.local_rank)

    def reply(self) -> Dict[str, int]:
        return {"rank": self.rank, "size": self.size, "local_rank": self.local_rank,
                "local_size": self.local_size, "cross_rank": self.cross_rank,
                "cross_size": self.cross_size}


def worker_name(host: str, slot: int) -> str:
    return f"{host}:{slot}"


def assign(hosts: Sequence[Tuple[str, int]], max_np: Optional[int]) -> List[Slot]:
    """Slots for ``hosts`` [(host, slots)] in order, at most ``max_np`` of them."""
    per_host: List[Tuple[str, List[int]]] = []
    cross: Dict[int, Dict[str, int]] = {}
    rank = 0
    for host, slots in hosts:
        ranks = []
        for local in range(slots):
            if max_np is not None and rank >= max_np:
                break
            ranks.append(rank)
            rank += 1
            at_local = cross.setdefault(local, {})
            at_local[host] = len(at_local)
        if ranks:
            per_host.append((host, ranks))
    size = rank
    out = []
    for host, ranks in per_host:
        for local, r in enumerate(ranks):
            out.append(Slot(host, local, r, size, len(ranks), cross[local][host], len(cross[local])))
    return out
