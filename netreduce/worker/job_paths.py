"""The data paths a job may run on, and the one decision every rank takes alike:
which of them it runs on now (at start, and after a failover).

Candidates, in order (docs/design.md, "Failover and degraded mode"):

1. the aggregator(s) of NETREDUCE_SWITCH (several: the multi-aggregator algorithm);
2. each standby of NETREDUCE_STANDBY_SWITCH, one aggregator each, in the order
   given (it may name the primary itself: a restarted daemon is then taken back);
3. with NETREDUCE_FALLBACK=host, the host-based all-reduce among the job's ranks
   (algorithms/host_fallback.py).

Trying a candidate means every rank connects (admission, rank check-in), then the
ranks exchange their outcomes through the job's rendezvous (rendezvous.py): the
candidate is taken only if every rank got in, so no rank runs on the host
algorithm while another waits at the aggregator. A refusal (job table full,
memory limit) or an unreachable aggregator moves every rank to the next one.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from netreduce import config
from netreduce.algorithms import host_fallback
from netreduce.algorithms.base import connect_settings
from netreduce.algorithms.flat import Flat
from netreduce.algorithms.multi_aggregator import MultiAggregator
from netreduce.errors import AdmissionError, ControlPlaneError, NetReduceError
from netreduce.protocol import auth
from netreduce.protocol.address import format_address, parse_addresses
from netreduce.worker.failover import Failover
from netreduce.worker.rendezvous import Rendezvous, rendezvous_address

log = logging.getLogger("netreduce")
Address = Tuple[str, int]


@dataclasses.dataclass
class Candidate:
    kind: str                  # "switch" or "host"
    addresses: List[Address]   # the aggregators; for "host" rank i's is addresses[i]

    def describe(self) -> str:
        if self.kind == "host":
            return f"the host all-reduce among the job's {len(self.addresses)} ranks"
        names = ", ".join(format_address(a) for a in self.addresses)
        return f"aggregator{'s' if len(self.addresses) > 1 else ''} {names}"


def enabled(knobs: Dict[str, Any]) -> bool:
    """Failover and degraded mode are on: a standby or NETREDUCE_FALLBACK=host."""
    return bool(knobs.get("NETREDUCE_STANDBY_SWITCH")) or knobs.get("NETREDUCE_FALLBACK") == "host"


def describe_config() -> str:
    """One line for `netreduce info`: off, or the paths a job would try in order."""
    try:
        knobs = config.snapshot()
        if not enabled(knobs):
            return "off (no NETREDUCE_STANDBY_SWITCH, NETREDUCE_FALLBACK=error)"
        paths = [c.describe() for c in candidates(knobs, None)]
        if knobs["NETREDUCE_FALLBACK"] == "host":
            paths.append("the host all-reduce among the job's ranks")
        try:
            rv = format_address(rendezvous_address(knobs))
        except NetReduceError:
            rv = "none (set NETREDUCE_RENDEZVOUS or MASTER_ADDR/MASTER_PORT)"
        return f"on: {' -> '.join(paths)}; rendezvous at rank 0: {rv}"
    except ValueError as exc:
        return f"<invalid: {exc}>"


def candidates(knobs: Dict[str, Any], hosts: Optional[Sequence[Address]]) -> List[Candidate]:
    out: List[Candidate] = []
    if knobs.get("NETREDUCE_SWITCH"):
        out.append(Candidate("switch", parse_addresses(knobs["NETREDUCE_SWITCH"])))
    for a in parse_addresses(knobs["NETREDUCE_STANDBY_SWITCH"], what="NETREDUCE_STANDBY_SWITCH") \
            if knobs.get("NETREDUCE_STANDBY_SWITCH") else []:
        out.append(Candidate("switch", [a]))
    if hosts is not None:
        out.append(Candidate("host", [tuple(h) for h in hosts]))
    return out


class Opener:
    """Opens a candidate on this rank and agrees on it with the others."""

    def __init__(self, rv: Any, topo: Any, knobs: Dict[str, Any],
                 connect: Callable[..., Any]) -> None:
        self.rv, self.topo, self.connect, self.knobs = rv, topo, connect, knobs
        self.timeout = float(knobs["NETREDUCE_TIMEOUT"])
        self.connect_kw = connect_settings(knobs)

    def _connect(self, address: Address, reach_for: float) -> Any:
        """Admission at ``address``; an aggregator not (yet) listening is asked again
        for ``reach_for`` seconds (a restarting daemon), a refusal is final."""
        deadline = time.monotonic() + reach_for
        t = self.topo
        while True:
            try:
                return self.connect(address, job=t.job, rank=t.rank, size=t.size, **self.connect_kw)
            except AdmissionError:
                raise
            except ControlPlaneError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def build(self, cand: Candidate, reach_for: float) -> Any:
        t = self.topo
        if cand.kind == "host":
            return host_fallback.build(cand.addresses, job=t.job, rank=t.rank, size=t.size,
                                       connect=self.connect, connect_kw=self.connect_kw)
        conns: List[Any] = []
        try:
            for address in cand.addresses:
                conns.append(self._connect(address, reach_for))
        except BaseException:
            for c in conns:
                c.close()
            raise
        return Flat(conns[0]) if len(conns) == 1 else MultiAggregator(conns)

    def agree(self, cand: Candidate, key: str, reach_for: float = 0.0) -> Tuple[Any, List[str]]:
        """(algorithm, []) if every rank got in, else (None, the ranks' reasons)."""
        algo, error = None, ""
        try:
            algo = self.build(cand, reach_for)
        except NetReduceError as exc:
            error = str(exc)
        values = self.rv.gather(key, {"ok": algo is not None, "error": error})
        by_error: Dict[str, List[int]] = {}
        for r, v in enumerate(values):
            if not v["ok"]:
                by_error.setdefault(str(v["error"]), []).append(r)
        bad = [f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {e}"
               for e, rs in by_error.items()]
        if bad and algo is not None:
            algo.close()
            algo = None
        if algo is not None and self.layered(cand):
            return self._layer(cand, algo, key)
        return algo, bad

    def layered(self, cand: Candidate) -> bool:
        """One aggregator and NETREDUCE_ALGORITHM auto or hierarchical: the algorithm
        over it follows the host layout (algorithms/select.py), as without failover."""
        return cand.kind == "switch" and len(cand.addresses) == 1 and self.topo.size > 1 \
            and self.knobs.get("NETREDUCE_ALGORITHM", "auto") != "flat"

    def _layer(self, cand: Candidate, algo: Any, key: str) -> Tuple[Any, List[str]]:
        """Every rank is in: the layout exchange over the new path, and the
        hierarchical algorithm where it calls for one; agreed like the admission."""
        # Imported here: select loads the native module (hierarchical's shared memory),
        # and `netreduce info` (describe_config) must work in a checkout without it.
        from netreduce.algorithms.select import build as build_algorithm
        address = cand.addresses[0]
        layered, error = None, ""
        try:
            layered = build_algorithm(algo.connection, self.topo,
                                      dict(self.knobs, NETREDUCE_SWITCH=format_address(address)),
                                      address, connect=self.connect)
        except NetReduceError as exc:
            error = str(exc)
        values = self.rv.gather(f"{key}-layout", {"ok": layered is not None, "error": error})
        bad = [f"rank {r}: {v['error']}" for r, v in enumerate(values) if not v["ok"]]
        if bad:
            (layered or algo).close()
            return None, bad
        return layered, []

    def first(self, cands: Sequence[Candidate], order: Sequence[int], key: str,
              reach_for: float = 0.0) -> Tuple[int, Any, List[str]]:
        """The first candidate of ``order`` that every rank gets into:
        (index, algorithm, reasons the earlier ones failed); (-1, None, reasons)."""
        reasons: List[str] = []
        for i in order:
            algo, bad = self.agree(cands[i], f"{key}-{i}", reach_for)
            if algo is not None:
                return i, algo, reasons
            reasons.append(f"{cands[i].describe()}: {'; '.join(bad[:3])}"
                           + (f" (+{len(bad) - 3} more errors)" if len(bad) > 3 else ""))
        return -1, None, reasons


class Started:
    """What netreduce.init() keeps for a job started with failover: the address its
    communicator negotiates through (rank 0's), the algorithm, and what to stop."""

    def __init__(self, address: Address, algorithm: Any, local: Any, rv: Any) -> None:
        self.address, self.algorithm, self.local, self.rv = address, algorithm, local, rv

    def stop(self) -> None:
        try:
            self.rv.close()
        finally:
            if self.local is not None:
                self.local.stop()


def start(topo: Any, knobs: Dict[str, Any], connect: Callable[..., Any],
          serve: Callable[..., Any]) -> Started:
    """Every rank of the job calls this at init: rendezvous, local aggregators,
    the first path every rank gets into, and the failover algorithm over it.
    ``connect`` opens a data-plane connection (netreduce/worker/dataplane.py);
    ``serve(host, port, secret_required=...)`` starts this rank's in-process
    aggregator (netreduce.api passes netreduce/switch/in_process.py's
    LocalAggregator: the worker does not import the daemon)."""
    several = [c for c in candidates(knobs, None) if len(c.addresses) > 1]
    if knobs.get("NETREDUCE_ALGORITHM") == "hierarchical" and several:
        raise NetReduceError(
            f"NETREDUCE_ALGORITHM=hierarchical with several aggregators ({several[0].describe()}"
            "): the two are not combined yet; use NETREDUCE_ALGORITHM=auto or flat, or name "
            "one aggregator")
    rv_address = rendezvous_address(knobs)
    host_mode = knobs.get("NETREDUCE_FALLBACK") == "host"
    secret = bool(auth.job_secret())
    loopback = rv_address[0] in ("127.0.0.1", "localhost")
    bind = "127.0.0.1" if loopback else "0.0.0.0"
    local = None
    rv = None
    try:
        if topo.rank == 0:
            local = serve(bind, rv_address[1], secret_required=secret)
        elif host_mode:
            local = serve(bind, 0, secret_required=secret)
        rv = Rendezvous(rv_address, topo.job, topo.rank, topo.size,
                        timeout=float(knobs["NETREDUCE_TIMEOUT"]),
                        connect_for=float(knobs["NETREDUCE_START_TIMEOUT"]))
        mine = None
        if host_mode:
            mine = list(rv_address) if topo.rank == 0 else [rv.local_ip, local.port]
        hosts = rv.gather("hosts", mine, wait=float(knobs["NETREDUCE_START_TIMEOUT"]))
        cands = candidates(knobs, hosts if host_mode else None)
        opener = Opener(rv, topo, knobs, connect)
        index, algo, reasons = opener.first(cands, range(len(cands)), "start")
        if algo is None:
            raise AdmissionError(f"rank {topo.rank} of job '{topo.job}': no data path admitted "
                                 "every rank: " + " | ".join(reasons))
        if reasons:  # degraded from the start: said once, by rank 0
            (log.warning if topo.rank == 0 else log.debug)(
                "netreduce: job '%s' runs on %s: %s (NETREDUCE_FALLBACK=%s)", topo.job,
                cands[index].describe(), " | ".join(reasons), knobs.get("NETREDUCE_FALLBACK"))
        algorithm = Failover(cands, index, algo, opener, rv, topo, float(knobs["NETREDUCE_TIMEOUT"]),
                             start_reasons=reasons)
        if local is not None and topo.rank == 0:  # netreduce info, metrics: switch/job_status.py
            local.publish(algorithm, knobs.get("NETREDUCE_JOB_METRICS", ""))
    except BaseException:
        if rv is not None:
            rv.close()
        if local is not None:
            local.stop()
        raise
    return Started(rv_address, algorithm, local, rv)
