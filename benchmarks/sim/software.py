"""Host software time in the SimGrid model: an alpha-beta term per sender.

The flow model alone charges only the wire (bytes / link rate + link latency). On
the emulated testbed every rank, and the aggregator daemon, is a process on a
2-core machine shared by 5-9 processes; the time a sender spends in software that
is *not* overlapped with its link shows up as a per-operation constant (the public
API's negotiation, the engine's set-up, scheduling) and a per-packet cost (the
data plane's work per packet while the link waits, which on a loaded machine is
mostly the sender being descheduled). Both are charged inside the simulation, as a
SimGrid ``exec`` on the sender's host before its flows start (engine.py):

* INA (``Software.seconds(packets)``): every worker, and every rack aggregator that
  forwards a partial sum, runs ``op_s + packets * packet_s`` seconds, ``packets``
  being what that node sends per all-reduce (payload bytes / ``payload``);
* ring (``step_s``): every worker runs ``step_s`` before each of its 2(N-1) steps
  (gloo's per-step synchronisation).

With one bottleneck link the closed form is t = op_s + packets * packet_s + wire
(tests/unit/test_simulation.py). Where each parameter is measured and how the fit
is kept apart from its check: benchmarks/sim/calibrate.py and docs/simulation.md.
The large-N fabric runs without it (``NONE``): the figures measured here are a
loaded 2-core VM's, not a data-centre host's."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict


@dataclasses.dataclass(frozen=True)
class Software:
    op_s: float = 0.0       # per operation, per sender
    packet_s: float = 0.0   # per packet sent, not overlapped with the wire
    step_s: float = 0.0     # per ring step, per worker
    payload: int = 8192     # payload bytes per packet (the testbed's 8 KiB)
    source: str = ""        # which measurement gave the numbers

    def packets(self, nbytes: float) -> int:
        return int(math.ceil(nbytes / self.payload)) if nbytes > 0 else 0

    def seconds(self, nbytes: float) -> float:
        """INA: a sender's software time for sending ``nbytes`` of payload."""
        return self.op_s + self.packets(nbytes) * self.packet_s

    @property
    def zero(self) -> bool:
        return self.op_s == 0 and self.packet_s == 0 and self.step_s == 0

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


NONE = Software(source="none")
