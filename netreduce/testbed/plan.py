"""The testbed's shape, computed before anything is created: names, addresses, rates.

Pure functions and dataclasses only, so that `up`, `down`, `run` and the tests agree
on every name without asking the kernel. Linux limits interface names to 15 bytes,
which is why a testbed name is at most 9 characters (`NAME-h199`, `NAME-agg`)."""
from __future__ import annotations

import dataclasses
import ipaddress
import re
from typing import List, Optional

from netreduce.errors import NetReduceError

# Address plan inside the testbed's /24: hosts .1 ... .N, aggregator .250, bridge .254.
# The bridge address lives in the root namespace; Open MPI's PMIx server needs one
# there so ranks inside the namespaces can reach mpirun.
AGGREGATOR_OCTET = 250
BRIDGE_OCTET = 254
MAX_HOSTS = 200
# Interface name inside every namespace, so that tools can be told one name
# (GLOO_SOCKET_IFNAME, btl_tcp_if_include, HOROVOD_GLOO_IFACE).
NS_IFNAME = "eth0"
AGGREGATOR = "agg"

_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,8}$")
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(bit|bps)?\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


class TestbedError(NetReduceError):
    """The testbed could not be built, used or torn down; the message says why."""

    __test__ = False  # not a pytest test class despite the name


def parse_rate(text: str) -> int:
    """'1gbit' -> 1_000_000_000 bits/s. Units as tc(8): kbit, mbit, gbit (SI, powers of
    10); 'bps' suffixes mean *bytes* per second, again as tc(8)."""
    if isinstance(text, (int, float)):
        return int(text)
    m = _RATE_RE.match(text)
    if not m:
        raise TestbedError(f"cannot parse rate {text!r}; write it like tc does: 500mbit, 1gbit, 10gbit")
    value = float(m.group(1)) * _SCALE[m.group(2).lower()]
    if (m.group(3) or "bit").lower() == "bps":
        value *= 8
    if value < 8000:
        raise TestbedError(f"rate {text!r} is below 8 kbit/s; tc tbf cannot shape that")
    return int(value)


def format_rate(bits_per_s: float) -> str:
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:g}{unit}"
    return f"{bits_per_s:g}bit"


@dataclasses.dataclass(frozen=True)
class Node:
    """One emulated machine: a network namespace with one veth into the bridge."""

    name: str        # "h0", "h1", ..., or "agg"
    netns: str       # namespace name, e.g. "nrtb-h0"
    address: str     # IPv4 address inside the namespace
    peer: str        # the veth end left in the root namespace, plugged into the bridge
    rate_bps: int    # shaped rate of this node's link, each direction
    ifname: str = NS_IFNAME
    address6: str = ""  # IPv6 address inside the namespace ("" unless the plan has IPv6)

    @property
    def index(self) -> Optional[int]:
        return int(self.name[1:]) if self.name.startswith("h") else None


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    hosts: List[Node]
    aggregator: Node
    bridge: str
    bridge_address: str
    prefixlen: int
    mtu: int
    queue_ms: float
    loss: float
    loss_proto: str
    subnet6: str = ""  # the /64 of the nodes' IPv6 addresses ("" = IPv4 only)

    @property
    def nodes(self) -> List[Node]:
        return [*self.hosts, self.aggregator]

    def node(self, which) -> Node:
        """A node by index (0..N-1), by 'hI', or 'agg'/'aggregator'."""
        if isinstance(which, Node):
            return which
        text = str(which)
        if text in (AGGREGATOR, "aggregator", "switch"):
            return self.aggregator
        if text.startswith("h"):
            text = text[1:]
        if text.isdigit() and int(text) < len(self.hosts):
            return self.hosts[int(text)]
        raise TestbedError(
            f"no host {which!r} in testbed {self.name!r}: hosts are 0..{len(self.hosts) - 1} and 'agg'")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        d = dict(d)
        d["hosts"] = [Node(**h) for h in d["hosts"]]
        d["aggregator"] = Node(**d["aggregator"])
        return cls(**d)


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise TestbedError(
            f"testbed name {name!r} must be 1-9 lowercase letters/digits starting with a letter "
            "(Linux interface names are at most 15 bytes: NAME-h199)")
    return name


def make_plan(hosts: int, rate, *, name: str = "nrtb", subnet: str = "10.77.0.0/24",
              aggregator_rate=None, mtu: int = 9000, queue_ms: float = 50.0,
              loss: float = 0.0, loss_proto: str = "all", ipv6: bool = False) -> Plan:
    """The testbed's layout. `aggregator_rate` defaults to hosts x rate (a switch's
    aggregate port bandwidth), so the aggregator's link is never the bottleneck.
    `ipv6` also gives every node an IPv6 address, in the unique-local /64 named after
    the IPv4 subnet (10.77.0.0/24 -> fd00:a:4d::/64), with the same last number."""
    check_name(name)
    if not 1 <= hosts <= MAX_HOSTS:
        raise TestbedError(f"--hosts must be 1..{MAX_HOSTS}, got {hosts}")
    if not 0.0 <= loss < 1.0:
        raise TestbedError(f"--loss is a fraction in [0, 1), got {loss}")
    if loss_proto not in ("all", "udp", "tcp"):
        raise TestbedError(f"--loss-proto must be all, udp or tcp, got {loss_proto!r}")
    if not 1280 <= mtu <= 65000:
        raise TestbedError(f"--mtu must be 1280..65000, got {mtu}")
    if queue_ms <= 0:
        raise TestbedError(f"--queue-ms must be positive, got {queue_ms}")
    try:
        net = ipaddress.ip_network(subnet)
    except ValueError as exc:
        raise TestbedError(f"--subnet {subnet!r}: {exc}") from None
    if net.version != 4 or net.prefixlen != 24:
        raise TestbedError(f"--subnet must be an IPv4 /24 like 10.77.0.0/24, got {subnet}")
    host_bps = parse_rate(rate)
    agg_bps = parse_rate(aggregator_rate) if aggregator_rate else hosts * host_bps
    base = net.network_address
    a, b, c, _ = base.packed
    net6 = ipaddress.ip_network(f"fd00:{a:x}:{b:x}:{c:x}::/64") if ipv6 else None

    def v6(last: int) -> str:
        return str(net6.network_address + last) if net6 is not None else ""

    nodes = [Node(name=f"h{i}", netns=f"{name}-h{i}", address=str(base + i + 1),
                  peer=f"{name}-h{i}", rate_bps=host_bps, address6=v6(i + 1))
             for i in range(hosts)]
    agg = Node(name=AGGREGATOR, netns=f"{name}-{AGGREGATOR}", address=str(base + AGGREGATOR_OCTET),
               peer=f"{name}-{AGGREGATOR}", rate_bps=agg_bps, address6=v6(AGGREGATOR_OCTET))
    return Plan(name=name, hosts=nodes, aggregator=agg, bridge=f"{name}-br",
                bridge_address=str(base + BRIDGE_OCTET), prefixlen=24, mtu=mtu,
                queue_ms=float(queue_ms), loss=float(loss), loss_proto=loss_proto,
                subnet6=str(net6) if net6 is not None else "")


def tbf_burst_bytes(rate_bps: int, mtu: int) -> int:
    """Token bucket depth. It must hold the largest packet tbf will see: veth does
    GSO, so TCP hands it up to 64 KiB super-packets (smaller buckets make tbf split
    them in software, a CPU cost that would distort the comparison). 2 ms of line rate
    above that keeps the shaper smooth at multi-gigabit rates on a busy 2-core box."""
    return max(131072, 4 * mtu, int(rate_bps / 8 * 0.002))


def tbf_limit_bytes(rate_bps: int, queue_ms: float, mtu: int) -> int:
    """Queue length behind the shaper in bytes: `queue_ms` of line rate (what a
    switch port's buffer holds), never less than a few jumbo frames."""
    return max(8 * mtu, int(rate_bps / 8 * queue_ms / 1000.0))
