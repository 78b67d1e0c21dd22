"""The routing problem: which aggregator sums each chunk, and by which paths.

A job is a set of workers (hosts) and its gradient as a list of chunk sizes in
bytes. Every chunk is all-reduced through one *root* aggregator picked from the
job's candidates. With rack aggregation each worker first sends the chunk to the
rack aggregator at its own switch (a fixed leg: there is one such aggregator), and
each rack aggregator forwards one partial sum to the root; without it every worker
is its own source. The root returns the sum down the reverse of each source's path.

So a placement is, per chunk, one root and, per (source, root), one of the
equal-cost shortest paths. Every byte of it lands on directed edges; the time of
a step is bounded below by the most loaded edge's bytes over its capacity, which
is the quantity GRID minimises (the congestion). This module turns jobs into that
0/1 problem: one variable per (chunk, root) and one per (chunk, root, source, path)
where a source has more than one path; ``incidence`` maps a 0/1 choice vector to
edge loads."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from netreduce.planner.topology import PlannerError, Topology, check_hosts


@dataclasses.dataclass
class Job:
    """One training job: ``chunks`` are byte counts, summed in this order."""
    name: str
    workers: List[str]
    chunks: List[int]
    rack_aggregation: bool = True
    candidates: Optional[List[str]] = None  # root aggregators; default: see roots()


@dataclasses.dataclass(frozen=True)
class Leg:
    """Bytes moved from src to dst along path (edge indices), one direction."""
    src: str
    dst: str
    path: Tuple[int, ...]
    nbytes: int


def split_chunks(sizes: Sequence[int], max_chunk: int) -> List[int]:
    """Cut tensors larger than ``max_chunk`` bytes into near-equal pieces (the data
    plane moves slots, so a tensor can be spread over aggregators at any boundary)."""
    out: List[int] = []
    for s in sizes:
        s = int(s)
        if s <= 0:
            continue
        pieces = max(1, -(-s // max_chunk)) if max_chunk > 0 else 1
        base, extra = divmod(s, pieces)
        out.extend(base + (1 if i < extra else 0) for i in range(pieces))
    return out


class Problem:
    """The variables, their edge incidence and the fixed load of a set of jobs."""

    def __init__(self, topo: Topology, jobs: Sequence[Job]) -> None:
        if not jobs:
            raise PlannerError("no jobs to place")
        self.topo = topo
        self.jobs = list(jobs)
        self.capacity = np.array([e.capacity for e in topo.edges])
        self.fixed = np.zeros(len(topo.edges))  # bytes every placement moves alike
        self.fixed_legs: List[Leg] = []
        # groups[g] = (job index, chunk index, size); options[g] = [(root, var,
        # [(source, [(path, var or -1)])])]
        self.groups: List[Tuple[int, int, int]] = []
        self.options: List[List[Tuple[str, int, List[Tuple[str, List[Tuple[Tuple[int, ...], int]]]]]]] = []
        self.nvars = 0
        rows: List[int] = []
        cols: List[int] = []
        vals: List[float] = []
        for j, job in enumerate(self.jobs):
            check_hosts(topo, job.workers)
            if not job.workers:
                raise PlannerError(f"job {job.name}: no workers")
            sources = self._sources(job)
            roots = self.roots(job)
            for c, size in enumerate(job.chunks):
                self.groups.append((j, c, int(size)))
                opts = []
                for root in roots:
                    xvar = self._var()
                    legs = []
                    for src in sources:
                        if src == root:
                            continue
                        paths = topo.paths(src, root)
                        if len(paths) == 1:
                            self._add(rows, cols, vals, paths[0], xvar, size)
                            legs.append((src, [(paths[0], -1)]))
                        else:
                            choice = []
                            for p in paths:
                                yvar = self._var()
                                self._add(rows, cols, vals, p, yvar, size)
                                choice.append((p, yvar))
                            legs.append((src, choice))
                    opts.append((root, xvar, legs))
                self.options.append(opts)
        self.incidence = sp.csr_matrix((vals, (rows, cols)),
                                       shape=(len(topo.edges), self.nvars))

    def roots(self, job: Job) -> List[str]:
        """Candidate roots: the job's list, else the spine-level aggregators when
        racks aggregate first (every aggregator when there is no spine level), else
        every aggregator."""
        if job.candidates:
            for a in job.candidates:
                if self.topo.nodes.get(a) is None or self.topo.nodes[a].kind != "aggregator":
                    raise PlannerError(f"job {job.name}: candidate {a!r} is not an "
                                       f"aggregator of topology {self.topo.name}")
            return list(job.candidates)
        if job.rack_aggregation:
            spine = self.topo.of_kind("aggregator", "spine")
            if spine:
                return spine
        return self.topo.of_kind("aggregator")

    def _sources(self, job: Job) -> List[str]:
        """Who sends partial sums to the root; records the fixed worker legs."""
        if not job.rack_aggregation:
            return list(job.workers)
        sources: Dict[str, None] = {}
        total = sum(int(s) for s in job.chunks)
        for w in job.workers:
            rack = self.topo.rack_aggregator(w)
            if rack is None:
                sources[w] = None  # no aggregator in this rack: the worker goes direct
                continue
            sources[rack] = None
            up = self.topo.paths(w, rack)[0]
            for leg in (Leg(w, rack, up, total),
                        Leg(rack, w, self.topo.reverse(up), total)):
                self.fixed_legs.append(leg)
                self.fixed[list(leg.path)] += total
        return list(sources)

    def _var(self) -> int:
        self.nvars += 1
        return self.nvars - 1

    def _add(self, rows: List[int], cols: List[int], vals: List[float],
             path: Sequence[int], var: int, size: int) -> None:
        # up the path and the result back down its reverse
        for e in tuple(path) + self.topo.reverse(path):
            rows.append(e)
            cols.append(var)
            vals.append(float(size))

    # -- evaluating choices -------------------------------------------------------
    def loads(self, z: np.ndarray) -> np.ndarray:
        """Edge loads in bytes for choice vector(s) z (nvars, or nvars x trials)."""
        extra = self.incidence @ z
        return (self.fixed[:, None] + extra) if extra.ndim == 2 else self.fixed + extra

    def congestion(self, z: np.ndarray) -> np.ndarray:
        """Seconds the most loaded edge needs: max over edges of load / capacity."""
        loads = self.loads(z)
        cap = self.capacity[:, None] if loads.ndim == 2 else self.capacity
        return (loads / cap).max(axis=0)

    def choice(self, picks: Sequence[Tuple[int, Sequence[int]]]) -> np.ndarray:
        """The 0/1 vector for picks[g] = (root option, path index per source leg)."""
        z = np.zeros(self.nvars)
        for g, (opt, paths) in enumerate(picks):
            root, xvar, legs = self.options[g][opt]
            z[xvar] = 1.0
            for (src, choice), p in zip(legs, paths):
                if choice[p][1] >= 0:
                    z[choice[p][1]] = 1.0
        return z

    def legs(self, picks: Sequence[Tuple[int, Sequence[int]]]) -> List[Leg]:
        """Every leg the picks move, fixed worker legs included."""
        out = list(self.fixed_legs)
        for g, (opt, paths) in enumerate(picks):
            size = self.groups[g][2]
            root, _, legs = self.options[g][opt]
            for (src, choice), p in zip(legs, paths):
                path = choice[p][0]
                out.append(Leg(src, root, path, size))
                out.append(Leg(root, src, self.topo.reverse(path), size))
        return out
