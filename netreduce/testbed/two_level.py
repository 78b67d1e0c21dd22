"""The two-level (rack + spine) testbed layout: R racks of H hosts, a rack aggregator
per rack and a spine, as host namespaces on the testbed's one bridge.

    hosts 0 .. R*H-1          the workers, rack r = hosts r*H .. r*H+H-1
    hosts R*H .. R*H+R-1      the rack aggregators (netreduce-switch --spine SPINE)
    host  R*H+R               the spine (or, for comparison, one aggregator for all)

Every namespace has one shaped link into the bridge, so the racks are logical: which
packets go where follows the tree, and the bridge stands for the fabric. A rack
aggregator stands for a top-of-rack switch, which has a port per member plus an
uplink: its link is shaped to (H + 1) x rate, so it never binds. Workers and the
spine get `rate`: the spine's link is the one that carries R partial sums per slot
(one per rack) where a single aggregator's carries R*H contributions."""
from __future__ import annotations

import dataclasses
from typing import List

from netreduce.testbed.plan import Plan, make_plan, parse_rate


@dataclasses.dataclass(frozen=True)
class TwoLevel:
    plan: Plan
    racks: int
    per_rack: int

    @property
    def workers(self) -> List[int]:
        return list(range(self.racks * self.per_rack))

    @property
    def rack_aggregators(self) -> List[int]:
        n = self.racks * self.per_rack
        return list(range(n, n + self.racks))

    @property
    def spine(self) -> int:
        return self.racks * self.per_rack + self.racks

    def rack_of(self, worker: int) -> int:
        """The host index of ``worker``'s rack aggregator."""
        return self.rack_aggregators[worker // self.per_rack]


def two_level_plan(racks: int, per_rack: int, rate, *, name: str = "nrtwo",
                   subnet: str = "10.78.250.0/24", **kw) -> TwoLevel:
    base = make_plan(racks * per_rack + racks + 1, rate, name=name, subnet=subnet, **kw)
    tor = parse_rate(rate) * (per_rack + 1)
    first = racks * per_rack
    hosts = [dataclasses.replace(n, rate_bps=tor) if first <= i < first + racks else n
             for i, n in enumerate(base.hosts)]
    return TwoLevel(dataclasses.replace(base, hosts=hosts), racks, per_rack)
