"""One membership epoch of an elastic job, and what the driver does when it ends.

An epoch ends once each of its workers has either checked in for the next one
(``READY``: it reset, after a failure or a host update), or exited (``SUCCESS`` with
code 0, else ``FAILURE``) — Horovod's worker-state barrier
(horovod/runner/elastic/registration.py). Then, in Horovod's order:

1. a worker succeeded: the job is done;
2. every worker failed: the job failed;
3. the hosts of failed workers are blacklisted;
4. every host of the epoch is blacklisted: the job failed;
5. ``--reset-limit`` resets done already: the job failed;
6. otherwise the next epoch is formed (driver.py), counting one reset.
"""
from __future__ import annotations

import dataclasses
import signal
import time
from typing import Dict, List, Optional, Tuple

from netreduce.launcher.elastic.assignment import Slot

READY, SUCCESS, FAILURE = "ready", "success", "failure"

RESET_LIMIT_MESSAGE = ("the job was stopped because its number of resets reached --reset-limit "
                       "{limit}")


@dataclasses.dataclass
class Membership:
    epoch: int
    slots: Dict[str, Slot]           # worker name (host:slot) -> its place
    updates: int                     # the driver's host-update count when it formed
    formed: float = dataclasses.field(default_factory=time.monotonic)
    states: Dict[str, str] = dataclasses.field(default_factory=dict)
    codes: Dict[str, int] = dataclasses.field(default_factory=dict)
    joined: set = dataclasses.field(default_factory=set)  # workers told their place

    @property
    def size(self) -> int:
        return len(self.slots)

    def hosts(self) -> List[str]:
        seen: List[str] = []
        for slot in sorted(self.slots.values(), key=lambda s: s.rank):
            if slot.host not in seen:
                seen.append(slot.host)
        return seen

    def record(self, name: str, state: str, code: Optional[int] = None) -> bool:
        """Record a worker's state; False when it is no member. A failure overrides
        READY (the worker died while waiting); nothing overrides an exit."""
        if name not in self.slots:
            return False
        if self.states.get(name) in (SUCCESS, FAILURE):
            return True
        self.states[name] = state
        if code is not None:
            self.codes[name] = code
        return True

    def breaking(self) -> bool:
        """Some worker checked in for the next epoch or failed: no new worker should
        enter this one."""
        return any(s in (READY, FAILURE) for s in self.states.values())

    def complete(self) -> bool:
        return len(self.states) >= len(self.slots)

    def count(self, state: str) -> int:
        return sum(1 for s in self.states.values() if s == state)

    def failed_hosts(self) -> List[str]:
        return sorted({self.slots[n].host for n, s in self.states.items() if s == FAILURE})

    def describe(self) -> str:
        return (f"epoch {self.epoch}: {self.size} rank(s) on "
                + ", ".join(f"{h}:{sum(1 for s in self.slots.values() if s.host == h)}"
                            for h in self.hosts()))


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def exit_code(code: int) -> int:
    """netreduce-run's exit code for a worker's: a signal's as a shell gives it (128 + n)."""
    return code if code > 0 else 128 - code


@dataclasses.dataclass(frozen=True)
class Decision:
    kind: str          # "done", "failed" or "reset"
    message: str = ""
    code: int = 0


def decide(m: Membership, blacklist, is_blacklisted, resets: int,
           reset_limit: Optional[int]) -> Decision:
    """What the driver does once ``m`` is complete (the module's list).
    ``blacklist(host)`` and ``is_blacklisted(host)`` are the host manager's."""
    failures = [(n, m.codes.get(n, 1)) for n, s in sorted(m.states.items()) if s == FAILURE]
    if m.count(SUCCESS):
        if failures:
            name, code = failures[0]
            return Decision("failed", f"worker {name} (rank {m.slots[name].rank}) "
                                      f"{describe_exit(code)} while others finished",
                            exit_code(code))
        return Decision("done")
    if failures and len(failures) == m.size:
        name, code = failures[0]
        return Decision("failed", f"every worker of {m.describe()} failed; the first, {name}, "
                                  f"{describe_exit(code)}", exit_code(code))
    for host in m.failed_hosts():
        blacklist(host)
    if all(is_blacklisted(h) for h in m.hosts()):
        return Decision("failed", f"every host of {m.describe()} is blacklisted (a worker "
                                  f"failed on each: {', '.join(m.failed_hosts())}); no host "
                                  "is left to continue on", 1)
    if reset_limit is not None and resets >= reset_limit:
        return Decision("failed", RESET_LIMIT_MESSAGE.format(limit=reset_limit), 1)
    return Decision("reset")


def previous_hosts_check(previous: Optional[Membership], hosts: List[Tuple[str, int]]) -> str:
    """Why the next epoch cannot form from ``hosts`` (empty if it can): no host of the
    previous epoch is left, so no rank holds the state to sync from."""
    if previous is None:
        return ""
    if set(previous.hosts()) & {h for h, _ in hosts}:
        return ""
    return (f"no host of the previous membership ({', '.join(previous.hosts())}) remains, so no "
            "rank holds the training state to sync the new ones from")
