"""Several aggregators: each all-reduce's buffer spread over k aggregators at once.

``NETREDUCE_SWITCH=a:4791,b:4791,...`` gives a job k aggregators. Every rank is
rank r of the same job at each of them (one data-plane connection per aggregator;
the first one, which the communicator already holds, also carries the job's
negotiation — the coordinator lives at the first aggregator in the list). A buffer
is cut into k contiguous element ranges, range i is reduced through aggregator i,
and the k native engines stream concurrently (each submit returns at once and its
engine thread runs with the GIL released), so aggregation throughput and the
aggregators' links add up like a rack of switches.

Why results are exact and identical on every rank: each element is summed by
exactly one aggregator, in that aggregator's usual way, and every rank receives
that aggregator's result — the same bytes the flat algorithm would give if that
aggregator had done the whole buffer. The placement is a pure function of the
buffer size, the call's position in the job's sequence (identical on every rank:
the negotiated execution order) and the weights, so every rank cuts alike.

Placement policy (``spread``): ranges proportional to ``weights`` (equal unless
given: NETREDUCE_PLACEMENT names a file written by the planner,
netreduce.planner.Placement.save_weights, with each aggregator's share of the job's
bytes under the GRID, hash or fixed policy, read by ``planned_weights``); buffers below
``min_split`` bytes are not cut but sent whole to one aggregator, round-robin by
call (a chunk per aggregator, like the planner's ``hash`` policy), so a small
tensor costs one round trip, not k.

A dead aggregator fails its range within NETREDUCE_TIMEOUT with a DataPlaneError
naming its address; the other ranges still complete (their aggregators are fine),
and the error names every aggregator that failed."""
from __future__ import annotations

import json
import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from netreduce import config
from netreduce.algorithms.base import check_reduction, unscaled
from netreduce.errors import DataPlaneError, InvalidArgumentError, NetReduceError
from netreduce.protocol.address import format_address, parse_address, resolve

log = logging.getLogger("netreduce")
MIN_SPLIT = 256 << 10  # bytes: smaller buffers go whole to one aggregator


def spread(count: int, itemsize: int, weights: Sequence[float], call: int,
           min_split: int = MIN_SPLIT) -> List[Tuple[int, int, int]]:
    """[(aggregator, first element, end element)] covering 0..count, no empty range."""
    k = len(weights)
    if count * itemsize < min_split or k == 1:
        return [(call % k, 0, count)] if count else [(0, 0, 0)]
    total = float(sum(weights))
    bounds = [0]
    acc = 0.0
    for w in weights[:-1]:
        acc += w
        bounds.append(int(round(count * acc / total)))
    bounds.append(count)
    return [(i, a, b) for i, (a, b) in enumerate(zip(bounds, bounds[1:])) if b > a]


def planned_weights(addresses: Sequence[Tuple[str, int]], path: str) -> List[float]:
    """Each aggregator's share from the planner's file ``path`` (NETREDUCE_PLACEMENT),
    in the order of ``addresses``; every rank reads the same file, so every rank cuts
    alike. An aggregator the file gives no share is refused by name."""
    try:
        with open(path) as f:
            doc = json.load(f)
        given = {format_address(resolve(parse_address(a))): float(w)
                 for a, w in doc["weights"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise NetReduceError(f"NETREDUCE_PLACEMENT={path}: not a placement file "
                             f"(Placement.save_weights): {exc}") from None
    weights = []
    for address in addresses:
        name = format_address(address)
        if given.get(name, 0.0) <= 0:
            raise NetReduceError(f"NETREDUCE_PLACEMENT={path} gives aggregator {name} no "
                                 f"share (it has {', '.join(sorted(given)) or 'none'}); plan "
                                 "with every NETREDUCE_SWITCH aggregator as a candidate root")
        weights.append(given[name])
    return weights


def _wait_all(requests: List[Any], errors: List[str]) -> None:
    """Wait for every submitted range (none may still be writing when the caller sees
    an error), then raise one DataPlaneError naming every failed aggregator's reason,
    the submission errors in ``errors`` first."""
    for req in requests:
        try:
            req.wait()
        except NetReduceError as exc:
            errors.append(str(exc))
    if errors:
        raise DataPlaneError("; ".join(errors))


class MultiRequest:
    """An all-reduce's ranges in flight at their aggregators. A range that could not
    be submitted is reported by wait(), after every submitted one is in (none may
    still be writing into the caller's array when the caller sees the error)."""

    def __init__(self, requests: List[Any], errors: List[str], result: np.ndarray) -> None:
        self._requests, self._errors, self._result = requests, errors, result

    def done(self) -> bool:
        return all(r.done() for r in self._requests)

    def wait(self) -> np.ndarray:
        _wait_all(self._requests, self._errors)
        return self._result


class MultiAggregator:
    name = "multi-aggregator"
    scales_results = False  # results scaled after the all-reduce, in Python (base.py)

    def __init__(self, connections: List[Any], weights: Optional[Sequence[float]] = None,
                 min_split: int = MIN_SPLIT) -> None:
        self.connections = connections
        self.addresses = [format_address(c.address) for c in connections]
        self.weights = list(weights) if weights else [1.0] * len(connections)
        if len(self.weights) != len(connections) or min(self.weights) <= 0:
            raise InvalidArgumentError(f"need one positive weight per aggregator "
                             f"({len(connections)}), got {self.weights}")
        self.min_split = min_split
        self._calls = 0

    @classmethod
    def build(cls, flat: Any, addresses: Sequence[Tuple[str, int]], *, job: str, rank: int,
              size: int, connect: Callable[..., Any], connect_kw: Dict[str, Any],
              weights: Optional[Sequence[float]] = None) -> "MultiAggregator":
        """``flat`` is this rank's connection to addresses[0]; join the job at the
        others too (every rank of the job calls this at init)."""
        conns = [flat]
        try:
            for address in addresses[1:]:
                conns.append(connect(address, job=job, rank=rank, size=size, **connect_kw))
        except BaseException:
            for c in conns[1:]:
                c.close()
            raise
        placement = config.get("NETREDUCE_PLACEMENT")
        if weights is None and placement:
            try:
                weights = planned_weights([c.address for c in conns], placement)
            except BaseException:
                for c in conns[1:]:
                    c.close()
                raise
        if rank == 0:
            log.info("netreduce: job %s spread over %d aggregators: %s (weights %s)", job,
                     len(conns), ", ".join(format_address(c.address) for c in conns),
                     weights or "equal")
        return cls(conns, weights)

    # -- the Algorithm interface ---------------------------------------------------
    def allreduce(self, src: np.ndarray, dst: Optional[np.ndarray] = None, op: str = "sum",
                  dtype: Optional[str] = None, scale: float = 1.0) -> np.ndarray:
        return self.allreduce_async(src, dst, op, dtype, scale).wait()

    def allreduce_async(self, src: np.ndarray, dst: Optional[np.ndarray] = None,
                        op: str = "sum", dtype: Optional[str] = None,
                        scale: float = 1.0) -> "MultiRequest":
        """Every range submitted to its aggregator's engine (each runs its requests in
        the order submitted) and returned at once; the request's wait() returns
        ``dst`` once every range is in (agreed groups in flight,
        netreduce/worker/pipeline.py)."""
        if scale != 1.0:
            raise unscaled(self.name, scale)
        # Checked whole before any range is submitted: a bad argument is the caller's
        # InvalidArgumentError, not a range's failure folded into DataPlaneError below.
        src, dst, _ = check_reduction(src, dst, op, dtype, "the aggregator")
        flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
        parts = spread(flat_src.size, src.dtype.itemsize, self.weights, self._calls,
                       self.min_split)
        self._calls += 1
        requests = []
        errors: List[str] = []
        for i, a, b in parts:
            try:
                requests.append(self.connections[i].allreduce_async(
                    flat_src[a:b], flat_dst[a:b], op=op, dtype=dtype))
            except NetReduceError as exc:
                errors.append(str(exc))
                break  # the later ranges were never submitted: nothing more to wait for
        return MultiRequest(requests, errors, dst)

    def reducescatter(self, src: np.ndarray, bounds: Sequence[Tuple[int, int]], op: str = "sum",
                      dtype: Optional[str] = None) -> None:
        """Owner delivery over several aggregators: rank r's stretch ``bounds[r]`` is
        spread over the aggregators like any buffer, each part a message whose sum only
        rank r receives (docs/protocol.md, "Reduce-scatter"); in place."""
        flat = check_reduction(src, None, op, dtype, "the aggregator")[0].reshape(-1)
        requests = []
        errors: List[str] = []
        for owner, (lo, hi) in enumerate(bounds):
            if hi <= lo:
                continue
            parts = spread(hi - lo, flat.dtype.itemsize, self.weights, self._calls,
                           self.min_split)
            self._calls += 1  # every rank counts the same calls: the same aggregator picks
            for i, a, b in parts:
                try:
                    requests.append(self.connections[i].allreduce_async(
                        flat[lo + a:lo + b], None, op=op, dtype=dtype, owner=owner))
                except NetReduceError as exc:
                    errors.append(str(exc))
                    break
            if errors:
                break
        _wait_all(requests, errors)

    def abort(self, reason: str) -> None:
        for c in self.connections:
            try:
                c.abort(reason)
            except NetReduceError:
                pass  # already closed

    def stats(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"algorithm": self.name, "aggregators": self.addresses}
        for i, c in enumerate(self.connections):
            for k, v in c.stats().items():
                out[f"agg{i}_{k}"] = v
                if isinstance(v, (int, float)) and k != "payload_bytes":
                    out[k] = out.get(k, 0) + v
        return out

    def counters(self) -> Dict[str, Any]:
        return self.connections[0].counters()

    def close(self) -> None:
        conns, self.connections = self.connections, []
        for c in conns:
            c.close()
