"""The network a placement is planned over: hosts, switches, aggregators and links.

A topology file (JSON, or YAML when PyYAML is installed; format in docs/planner.md)
lists the nodes and the full-duplex links between them with their capacities in
Gbit/s. A link is two directed edges of that capacity, one per direction, because a
gradient going up to an aggregator and its result coming down do not compete.

An aggregator is a node of its own, attached to the switch (or host) it runs in by a
link whose capacity is its aggregation throughput: a NetReduce FPGA board behind a
100 Gbit/s port, a netreduce-switch daemon behind its NIC, or a switch ASIC at line
rate. Every byte an aggregator sums or returns crosses that link, so the planner
sees aggregator capacity as it sees any other link.

A ``spine_leaf`` section generates the usual two-tier data-centre fabric instead of
listing a thousand hosts by hand."""
from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from netreduce.errors import NetReduceError

KINDS = ("host", "switch", "aggregator")
MAX_PATHS = 64  # equal-cost paths kept per pair (a 64-spine fabric at most)


class PlannerError(NetReduceError):
    """A topology file, a job or a placement request is malformed or infeasible."""


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    kind: str  # one of KINDS
    level: str = ""  # aggregators: "rack" (sums one rack's workers) or "spine" (or "")


@dataclasses.dataclass(frozen=True)
class Edge:
    """One direction of a link. ``capacity`` is in bytes per second."""
    index: int
    src: str
    dst: str
    capacity: float
    latency: float  # seconds
    link: str  # the link's name, shared by both directions


class Topology:
    """Nodes, directed edges and the equal-cost shortest paths between nodes."""

    def __init__(self, name: str = "topology") -> None:
        self.name = name
        self.nodes: Dict[str, Node] = {}
        self.edges: List[Edge] = []
        self._out: Dict[str, List[Edge]] = collections.defaultdict(list)
        self._paths: Dict[Tuple[str, str], List[Tuple[int, ...]]] = {}

    # -- building -------------------------------------------------------------
    def add_node(self, name: str, kind: str, level: str = "") -> Node:
        if kind not in KINDS:
            raise PlannerError(f"topology {self.name}: node {name!r} has kind {kind!r}; "
                               f"expected one of {', '.join(KINDS)}")
        if name in self.nodes:
            raise PlannerError(f"topology {self.name}: node {name!r} is declared twice")
        node = Node(str(name), kind, str(level or ""))
        self.nodes[node.name] = node
        return node

    def add_link(self, a: str, b: str, gbps: float, latency_us: float = 1.0,
                 name: str = "") -> None:
        for end in (a, b):
            if end not in self.nodes:
                raise PlannerError(f"topology {self.name}: link {a}-{b} names unknown "
                                   f"node {end!r}")
        if not gbps or gbps <= 0:
            raise PlannerError(f"topology {self.name}: link {a}-{b} needs a capacity "
                               f"> 0 Gbit/s, got {gbps!r}")
        name = name or f"{a}-{b}"
        for src, dst in ((a, b), (b, a)):
            edge = Edge(len(self.edges), src, dst, float(gbps) * 1e9 / 8,
                        float(latency_us) * 1e-6, name)
            self.edges.append(edge)
            self._out[src].append(edge)
        self._paths.clear()

    # -- queries --------------------------------------------------------------
    def of_kind(self, kind: str, level: Optional[str] = None) -> List[str]:
        return [n.name for n in self.nodes.values()
                if n.kind == kind and (level is None or n.level == level)]

    def neighbours(self, name: str) -> List[str]:
        return [e.dst for e in self._out[name]]

    def attachment(self, name: str) -> str:
        """The switch a host or an aggregator is cabled to (its first switch link)."""
        for e in self._out[self._known(name)]:
            if self.nodes[e.dst].kind == "switch":
                return e.dst
        raise PlannerError(f"topology {self.name}: {name!r} has no link to a switch")

    def rack_aggregator(self, host: str) -> Optional[str]:
        """The rack-level aggregator attached to ``host``'s switch, if there is one."""
        switch = self.attachment(host)
        for e in self._out[switch]:
            node = self.nodes[e.dst]
            if node.kind == "aggregator" and node.level == "rack":
                return node.name
        return None

    def paths(self, src: str, dst: str) -> List[Tuple[int, ...]]:
        """Every shortest path (by hops) from src to dst as a tuple of edge indices,
        in a fixed order (ECMP's candidate set); at most MAX_PATHS. Paths never pass
        through a host or an aggregator other than their ends."""
        key = (self._known(src), self._known(dst))
        if key not in self._paths:
            self._paths[key] = self._shortest(src, dst)
            if not self._paths[key] and src != dst:
                raise PlannerError(f"topology {self.name}: no path from {src} to {dst}")
        return self._paths[key]

    def _shortest(self, src: str, dst: str) -> List[Tuple[int, ...]]:
        if src == dst:
            return [()]
        # BFS from src, through switches only, recording each node's parents.
        depth = {src: 0}
        parents: Dict[str, List[Edge]] = collections.defaultdict(list)
        frontier = [src]
        while frontier and dst not in depth:
            nxt: List[str] = []
            for u in frontier:
                if u != src and self.nodes[u].kind != "switch":
                    continue  # hosts and aggregators are not transit nodes
                for e in self._out[u]:
                    if e.dst not in depth:
                        depth[e.dst] = depth[u] + 1
                        nxt.append(e.dst)
                    if depth[e.dst] == depth[u] + 1:
                        parents[e.dst].append(e)
            frontier = nxt
        if dst not in depth:
            return []
        out: List[Tuple[int, ...]] = []

        def walk(node: str, tail: Tuple[int, ...]) -> None:
            if len(out) >= MAX_PATHS:
                return
            if node == src:
                out.append(tail)
                return
            for e in parents[node]:
                walk(e.src, (e.index,) + tail)

        walk(dst, ())
        return sorted(out)

    def reverse(self, path: Sequence[int]) -> Tuple[int, ...]:
        """The same path walked back (each edge's opposite direction)."""
        return tuple(e ^ 1 for e in reversed(path))  # edges are added in pairs

    def latency(self, path: Sequence[int]) -> float:
        return sum(self.edges[e].latency for e in path)

    def _known(self, name: str) -> str:
        if name not in self.nodes:
            raise PlannerError(f"topology {self.name}: unknown node {name!r}")
        return name


# -- files ----------------------------------------------------------------------
def load(path: str) -> Topology:
    """Read a topology file: .json, or .yaml/.yml (needs PyYAML)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PlannerError(f"cannot read topology file {path}: {e.strerror}") from e
    if os.path.splitext(path)[1].lower() in (".yaml", ".yml"):
        try:
            import yaml  # PyYAML: optional, only for YAML files
        except ImportError as e:
            raise PlannerError(f"{path} is YAML: pip install pyyaml, or write it as "
                               "JSON") from e
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise PlannerError(f"{path}: not valid YAML: {e}") from e
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlannerError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise PlannerError(f"{path}: expected a mapping at the top level")
    return from_dict(data, default_name=os.path.basename(path))


def from_dict(data: Dict[str, Any], default_name: str = "topology") -> Topology:
    topo = Topology(str(data.get("name", default_name)))
    lat = float(data.get("latency_us", 1.0))
    if "spine_leaf" in data:
        spine_leaf(topo, **data["spine_leaf"])
    for kind in ("switches", "hosts", "aggregators"):
        for item in data.get(kind, []):
            item = {"name": item} if isinstance(item, str) else dict(item)
            attach = item.pop("attach", None)
            gbps = item.pop("gbps", None)
            topo.add_node(item["name"], kind[:-1] if kind != "switches" else "switch",
                          item.get("level", ""))
            if attach is not None:  # shorthand: one link to the node it hangs off
                topo.add_link(item["name"], attach, gbps, item.get("latency_us", lat))
    for link in data.get("links", []):
        try:
            topo.add_link(link["a"], link["b"], link["gbps"], link.get("latency_us", lat),
                          link.get("name", ""))
        except KeyError as e:
            raise PlannerError(f"topology {topo.name}: link {link} lacks {e}") from e
    if not topo.of_kind("aggregator"):
        raise PlannerError(f"topology {topo.name}: no aggregators")
    return topo


def spine_leaf(topo: Topology, racks: int, hosts_per_rack: int, spines: int,
               host_gbps: float = 100.0, uplink_gbps: float = 100.0,
               latency_us: float = 1.0, rack_aggregator_gbps: Optional[float] = None,
               spine_aggregator_gbps: Optional[float] = None) -> Topology:
    """A two-tier fabric: ``racks`` leaves of ``hosts_per_rack`` hosts, each leaf
    cabled to every one of ``spines`` spines. Oversubscription is
    hosts_per_rack*host_gbps : spines*uplink_gbps. Aggregators are added at every
    leaf (level rack) and every spine (level spine) when their throughput is given.
    Hosts are named r{rack}h{i}, leaves leaf{r}, spines spine{s}."""
    for s in range(spines):
        topo.add_node(f"spine{s}", "switch")
        if spine_aggregator_gbps:
            topo.add_node(f"agg-spine{s}", "aggregator", "spine")
            topo.add_link(f"agg-spine{s}", f"spine{s}", spine_aggregator_gbps, latency_us)
    for r in range(racks):
        topo.add_node(f"leaf{r}", "switch")
        for s in range(spines):
            topo.add_link(f"leaf{r}", f"spine{s}", uplink_gbps, latency_us)
        if rack_aggregator_gbps:
            topo.add_node(f"agg-leaf{r}", "aggregator", "rack")
            topo.add_link(f"agg-leaf{r}", f"leaf{r}", rack_aggregator_gbps, latency_us)
        for i in range(hosts_per_rack):
            topo.add_node(f"r{r}h{i}", "host")
            topo.add_link(f"r{r}h{i}", f"leaf{r}", host_gbps, latency_us)
    return topo


def hosts_in_order(topo: Topology) -> List[str]:
    """Hosts in declaration order (racks contiguous for a generated fabric)."""
    return topo.of_kind("host")


def describe(topo: Topology) -> str:
    kinds = collections.Counter(n.kind for n in topo.nodes.values())
    return (f"{topo.name}: {kinds['host']} hosts, {kinds['switch']} switches, "
            f"{kinds['aggregator']} aggregators, {len(topo.edges) // 2} links")


def check_hosts(topo: Topology, names: Iterable[str]) -> List[str]:
    names = list(names)
    bad = [n for n in names if topo.nodes.get(n, Node(n, "")).kind != "host"]
    if bad:
        raise PlannerError(f"topology {topo.name}: not hosts: {', '.join(bad[:5])}")
    return names
