"""The response cache: the ids the coordinator gave tensor names (docs/control_plane.md,
"The coordinator and the response cache").

Each name the coordinator logs gets an id (a log entry's ``assign`` map); while this
rank's signature for the name stays the one the id was assigned for, the name goes
out as its id, and in the steady state does not go out at all: the ranks agree on
cached ids among themselves (netreduce/worker/agreement.py).
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

from netreduce.protocol.messages import TensorRequest
from netreduce.protocol.signature import Signature


class ResponseCache:
    """name <-> id as the coordinator assigned them. A name goes out as its id only
    when this rank's signature equals the one the id was assigned for."""

    def __init__(self) -> None:
        self.id_of: Dict[str, Tuple[int, Signature]] = {}
        self.name_of: Dict[int, str] = {}
        self.hits = 0

    def encode(self, name: str, sig: Signature, cacheable: bool) -> Any:
        known = self.id_of.get(name)
        if known is not None and known[1] == sig:
            self.hits += 1
            return known[0]
        return TensorRequest.of(name, sig, cacheable)

    def learn(self, assign: Dict[str, int], sigs: Dict[str, Signature]) -> None:
        for name, new_id in assign.items():
            old = self.id_of.get(name)
            if old is not None:
                self.name_of.pop(old[0], None)
            self.id_of[name] = (new_id, sigs[name])
            self.name_of[new_id] = name

    def resolve(self, ref: Any) -> str:
        return self.name_of[ref] if isinstance(ref, int) else ref
