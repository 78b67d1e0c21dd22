"""Choosing the algorithm, once per init, identically on every rank.

The choice is a pure function of the exchanged host layout and NETREDUCE_ALGORITHM
(which every rank of a job must set alike):

* ``auto`` — hierarchical when some host runs more than one rank and every host runs
  the same number; flat otherwise. Hosts with different numbers of ranks run flat
  (their shards would not line up across hosts) and rank 0 logs why.
* ``flat`` — always flat; no topology exchange at all.
* ``hierarchical`` — refused with TopologyError when the hosts' local sizes differ;
  on a single rank it is flat (there is nothing to share).

Several aggregators in NETREDUCE_SWITCH (a comma-separated list) select the
multi-aggregator algorithm (multi_aggregator.py) under ``auto`` and ``flat``; with
``hierarchical`` they are refused (not combined yet).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List

from netreduce.algorithms import hosts
from netreduce.algorithms.base import connect_settings
from netreduce.algorithms.flat import Flat
from netreduce.algorithms.hierarchical import Hierarchical
from netreduce.algorithms.hosts import Layout, TopologyError
from netreduce.algorithms.multi_aggregator import MultiAggregator
from netreduce.protocol.address import parse_addresses

log = logging.getLogger("netreduce")


def choose(mode: str, layout: Layout) -> str:
    """'flat' or 'hierarchical' for this layout, or TopologyError."""
    if mode == "flat" or layout_ranks(layout) == 1:
        return "flat"
    sizes = sorted({len(h) for h in layout.hosts})
    if len(sizes) > 1:
        if mode == "hierarchical":
            raise TopologyError(
                "NETREDUCE_ALGORITHM=hierarchical needs the same number of ranks on every "
                f"host, but the hosts run {sizes} ranks ({layout.describe()}); use "
                "NETREDUCE_ALGORITHM=flat or auto, or launch as many ranks on every host")
        if layout.rank == 0:
            log.warning("netreduce: hosts run different numbers of ranks (%s): using the "
                        "flat all-reduce", layout.describe())
        return "flat"
    if mode == "hierarchical" or sizes[0] > 1:
        return "hierarchical"
    return "flat"


def layout_ranks(layout: Layout) -> int:
    return sum(len(h) for h in layout.hosts)


def build(connection: Any, topo: Any, knobs: Dict[str, Any], address: Any,
          connect: Callable[..., Any]) -> Any:
    """The algorithm for this rank, over ``connection`` (its flat data-plane
    connection, already admitted). Every rank of the job calls this together, after
    every rank has joined (the exchange runs over the flat data plane). ``connect``
    opens the further connections an algorithm needs (netreduce/worker/dataplane.py's
    connect, or the unit tests' fake)."""
    mode = knobs["NETREDUCE_ALGORITHM"]
    addresses = aggregators(knobs, address)
    if len(addresses) > 1 and topo.size > 1:
        return several_aggregators(connection, addresses, topo, knobs, mode, connect)
    if mode == "flat" or topo.size == 1:
        return Flat(connection)

    def allreduce_int64(rows: Any) -> Any:
        return connection.allreduce(rows)

    layout = hosts.exchange(allreduce_int64, topo.rank, topo.size, topo.local_rank,
                               topo.local_size, topo.local_known)
    if choose(mode, layout) == "flat":
        return Flat(connection)
    return Hierarchical.build(
        connection, layout, job=topo.job, address=address,
        timeout=float(knobs["NETREDUCE_TIMEOUT"]),
        start_timeout=float(knobs["NETREDUCE_START_TIMEOUT"]),
        shard_chunk=int(knobs["NETREDUCE_SHM_CHUNK"]),
        spin_us=float(knobs["NETREDUCE_SHM_SPIN_US"]), connect=connect,
        connect_kw=connect_settings(knobs))


def aggregators(knobs: Dict[str, Any], address: Any) -> List[Any]:
    """Every aggregator of the job: NETREDUCE_SWITCH's list (its first is
    ``address``, the one the communicator negotiates through), else ``address``."""
    text = knobs.get("NETREDUCE_SWITCH") or ""
    return parse_addresses(text) if "," in text else [address]


def several_aggregators(connection: Any, addresses: List[Any], topo: Any,
                        knobs: Dict[str, Any], mode: str, connect: Callable[..., Any]) -> Any:
    """The multi-aggregator algorithm over flat connections (one per aggregator)."""
    if mode == "hierarchical":
        raise TopologyError(
            f"NETREDUCE_ALGORITHM=hierarchical with {len(addresses)} aggregators "
            f"(NETREDUCE_SWITCH={knobs['NETREDUCE_SWITCH']}): the two are not combined yet; "
            "use NETREDUCE_ALGORITHM=auto or flat, or name one aggregator")
    return MultiAggregator.build(
        connection, addresses, job=topo.job, rank=topo.rank, size=topo.size, connect=connect,
        connect_kw=connect_settings(knobs))
