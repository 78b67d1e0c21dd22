"""A job's payload size, chosen at admission from its ranks' paths (docs/protocol.md,
"Payload size").

Every datagram carries DF, so a payload must fit the smallest MTU on the way. Two
views of each rank's path are taken when it registers: the MTU the rank's kernel
reports toward the aggregator (IP_MTU / IPV6_MTU of a connected UDP socket, sent in
``register``), and the MTU of the aggregator's own route back toward the rank. The
job's payload is the largest that the smallest of all these views carries, at most
the aggregator's cap (``--payload-bytes``, else the wire's largest).

Ranks join at different times, so the choice is made in two steps: the first rank's
views size the pool provisionally (its 2 x K x P bytes are reserved at once, so
admission is refused or granted when the first rank arrives), each later rank can
only lower it, and when the last rank has registered the pool is shrunk to the final
P and every rank learns it (``payload`` command). No rank sends data before that."""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Tuple

from netreduce.errors import InvalidArgumentError

PayloadForMtu = Callable[[int, bool], int]


@dataclasses.dataclass(frozen=True)
class PathView:
    rank: int
    mtu: int
    ipv6: bool
    source: str   # who saw it: "reported by rank 2 (host h2, 10.0.0.3)", ...
    payload: int  # what this MTU carries


def describe(mtu: int) -> str:
    return f"path MTU {mtu}" + (" (loopback)" if mtu >= 65535 else "")


def views_of(rank: int, host: str, peer_ip: str, reported: Optional[Tuple[int, bool]],
             own: Optional[Tuple[int, bool]], payload_for_mtu: PayloadForMtu) -> List[PathView]:
    """The views of one rank's path: ``reported`` (mtu, ipv6) by the rank itself,
    ``own`` the aggregator's route toward ``peer_ip``; either may be missing."""
    who = f"rank {rank} (host {host}, {peer_ip})" if host else f"rank {rank} ({peer_ip})"
    views = []
    if reported is not None:
        views.append(PathView(rank, reported[0], reported[1], f"reported by {who}",
                              payload_for_mtu(reported[0], reported[1])))
    if own is not None:
        views.append(PathView(rank, own[0], own[1], f"of the aggregator's route toward {who}",
                              payload_for_mtu(own[0], own[1])))
    return views


@dataclasses.dataclass
class JobPayload:
    """The views seen so far for one job and what they allow."""
    cap: int           # the aggregator's largest payload
    explicit: bool     # the cap was given as --payload-bytes
    views: List[PathView] = dataclasses.field(default_factory=list)

    def add(self, views: List[PathView]) -> None:
        self.views.extend(views)

    def choose(self) -> Tuple[int, str]:
        """(payload bytes, why) from the views so far."""
        narrowest = min(self.views, key=lambda v: v.payload, default=None)
        if narrowest is None:
            return self.cap, f"payload {self.cap} B: no path MTU known, the aggregator's largest"
        path = f"{describe(narrowest.mtu)} {narrowest.source}"
        if narrowest.payload < 8:
            raise InvalidArgumentError(f"{path} leaves no room for a payload")
        if narrowest.payload < self.cap:
            return narrowest.payload, f"payload {narrowest.payload} B: {path}"
        if self.explicit:
            return self.cap, (f"payload {self.cap} B: netreduce-switch --payload-bytes {self.cap} "
                              f"(the narrowest path, {path}, allows {narrowest.payload} B)")
        return self.cap, f"payload {self.cap} B: {path}; the wire's largest (jumbo extension)"
