"""Which hosts an elastic job may use: discovery, and the blacklist.

Horovod 0.28.1's rules (horovod/runner/elastic/discovery.py), re-implemented:

* ``--host-discovery-script`` is run (through the shell) every second; each line of
  its output is ``host:slots``, or ``host`` alone, which gets ``--slots-per-host``
  (launcher/hosts.py parses it).
  An empty output is no hosts at all. A script that fails the first time fails the
  job (a misconfiguration); later failures are logged and the last answer stands.
  With ``-H``/``--hostfile`` instead, the hosts are fixed (at least two: with one host
  there is nothing to fail over to).
* Hosts keep the order in which they were first seen, new ones appended, so the
  oldest hosts hold the lowest ranks and rank 0 keeps the state to sync from.
* A host on which a worker failed is blacklisted: it gets no rank until, with
  ``--blacklist-cooldown-range LOW HIGH``, its cooldown ends — LOW·2^k plus up to LOW
  at random for its k-th blacklisting, capped to [LOW, HIGH] — and discovery still
  lists it; it then counts as added. Without a range a blacklisting is for good.
"""
from __future__ import annotations

import enum
import random
import subprocess
import time
from typing import Dict, List, Optional, Tuple

from netreduce.errors import ConfigError
from netreduce.launcher import hosts as hostlist

COOLDOWN_FLOOR_S = 1          # Horovod's bounds on --blacklist-cooldown-range
COOLDOWN_CEILING_S = 3600
SCRIPT_TIMEOUT_S = 30.0       # a discovery script that hangs is a failed run of it


class DiscoveryError(ConfigError):
    """The discovery script failed or printed something that is not host:slots."""


class Update(enum.IntFlag):
    """Horovod's HostUpdateResult."""
    none = 0
    removed = 1
    added = 2
    mixed = 3


def host_slots(hosts: List[hostlist.Host]) -> Dict[str, int]:
    return {h.name: h.slots for h in hosts}


class ScriptDiscovery:
    """``--host-discovery-script``: run it, read host:slots lines."""

    def __init__(self, script: str, default_slots: Optional[int]) -> None:
        self.script = script
        self.default_slots = default_slots

    def describe(self) -> str:
        return f"--host-discovery-script {self.script}"

    def find(self) -> Dict[str, int]:
        try:
            done = subprocess.run(self.script, shell=True, capture_output=True, text=True,
                                  timeout=SCRIPT_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise DiscoveryError(f"discovery script {self.script} did not finish within "
                                 f"{SCRIPT_TIMEOUT_S:g} s") from None
        if done.returncode != 0:
            err = done.stderr.strip().splitlines()[-1:] or ["(no output on stderr)"]
            raise DiscoveryError(f"discovery script {self.script} exited with code "
                                 f"{done.returncode}: {err[0]}")
        try:
            return host_slots(hostlist.parse_discovery(done.stdout, self.default_slots,
                                                       f"discovery script {self.script}"))
        except hostlist.HostsError as exc:
            raise DiscoveryError(str(exc)) from None


class FixedHosts:
    """``-H host:slots,...`` or ``--hostfile``: the same hosts every time."""

    def __init__(self, host_slots: Dict[str, int], where: str = "-H") -> None:
        self.host_slots = dict(host_slots)
        self.where = where

    def describe(self) -> str:
        return self.where

    def find(self) -> Dict[str, int]:
        return dict(self.host_slots)


class HostState:
    """One host's blacklisting and cooldown."""

    def __init__(self, cooldown: Optional[Tuple[int, int]]) -> None:
        self.cooldown = cooldown
        self.blacklisted = False
        self.count = 0
        self.until = 0.0  # end of the cooldown (time.time()), 0 = none

    def blacklist(self, now: float) -> float:
        """Blacklist; returns the cooldown's length (0: for good)."""
        self.blacklisted = True
        if self.cooldown is None or self.until > now:
            return max(0.0, self.until - now) if self.until else 0.0
        low, high = self.cooldown
        self.count += 1
        delay = low * (1 << self.count) + random.uniform(0, 1) * low
        span = max(low, min(high, delay))
        self.until = now + span
        return span

    def resurrected(self, now: float) -> bool:
        """Blacklisted with a cooldown that has ended."""
        return self.blacklisted and self.until > 0 and now >= self.until

    def whitelist(self) -> None:
        self.blacklisted = False
        self.until = 0.0


class HostManager:
    """The discovered hosts, their order, and which are blacklisted."""

    def __init__(self, discovery, cooldown: Optional[Tuple[int, int]] = None) -> None:
        self.discovery = discovery
        self.cooldown = cooldown
        self.host_slots: Dict[str, int] = {}
        self.order: List[str] = []  # first-seen order, blacklisted hosts included
        self.states: Dict[str, HostState] = {}

    def state(self, host: str) -> HostState:
        if host not in self.states:
            self.states[host] = HostState(self.cooldown)
        return self.states[host]

    def update(self, found: Optional[Dict[str, int]] = None) -> Update:
        """Take discovery's answer (run it when ``found`` is None: DiscoveryError);
        what changed."""
        if found is None:
            found = self.discovery.find()
        now = time.time()
        res = Update.none
        for host in self.host_slots:
            if host not in found:
                res |= Update.removed
        for host, slots in found.items():
            before = self.host_slots.get(host)
            if before is None or slots > before:
                res |= Update.added
            elif slots < before:
                res |= Update.removed
            elif self.state(host).resurrected(now):
                res |= Update.added
        for host in found:
            if self.state(host).resurrected(now):
                self.state(host).whitelist()
        self.host_slots = found
        self.order = [h for h in self.order if h in found] + \
            [h for h in found if h not in self.order]
        return res

    def available(self) -> List[Tuple[str, int]]:
        """(host, slots) in assignment order, blacklisted hosts left out."""
        return [(h, self.host_slots[h]) for h in self.order
                if not self.state(h).blacklisted and self.host_slots.get(h, 0) > 0]

    def available_slots(self) -> int:
        return sum(slots for _, slots in self.available())

    def blacklist(self, host: str) -> Optional[float]:
        """Blacklist ``host``; its cooldown in seconds (0: for good), None when it was
        blacklisted already."""
        state = self.state(host)
        first = not state.blacklisted
        span = state.blacklist(time.time())
        return span if first else None

    def is_blacklisted(self, host: str) -> bool:
        return self.state(host).blacklisted
