"""Placement policies: which root aggregator and path each chunk takes.

One small interface, three policies, chosen by name (``policy(name)``):

* ``fixed`` — every chunk of a job through the job's one default root (what a job
  configured with a single NETREDUCE_SWITCH does), paths by ECMP hash of the
  (source, root) pair: the "default routing" GRID compares against.
* ``hash`` — each chunk to a root by a hash of (job, chunk), paths by a hash of
  (job, chunk, source): per-flow ECMP where a chunk is a flow.
* ``grid`` — the LP relaxation (lp.py) then randomized rounding (rounding.py).

Hashes are BLAKE2b digests of the names, so every process derives the same placement."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Dict, List, Optional, Sequence

import numpy as np

from netreduce.planner import lp, rounding
from netreduce.planner.problem import Job, Leg, Problem
from netreduce.planner.topology import PlannerError, Topology


@dataclasses.dataclass
class Placement:
    policy: str
    problem: Problem
    picks: rounding.Picks
    congestion: float  # seconds on the most loaded edge
    bound: Optional[float] = None  # LP lower bound (grid only)
    stats: Dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def approximation(self) -> Optional[float]:
        """Rounded congestion over the LP bound (>= 1; 1 is optimal)."""
        return self.congestion / self.bound if self.bound else None

    def roots(self) -> List[List[str]]:
        """roots()[j][c]: the aggregator chunk c of job j is summed at."""
        out: List[List[str]] = [[] for _ in self.problem.jobs]
        for g, (opt, _) in enumerate(self.picks):
            j, _, _ = self.problem.groups[g]
            out[j].append(self.problem.options[g][opt][0])
        return out

    def legs(self) -> List[Leg]:
        return self.problem.legs(self.picks)

    def shares(self, job: int = 0) -> Dict[str, float]:
        """Fraction of job ``job``'s bytes summed at each root aggregator."""
        chunks = self.problem.jobs[job].chunks
        total = float(sum(chunks)) or 1.0
        out: Dict[str, float] = {}
        for root, nbytes in zip(self.roots()[job], chunks):
            out[root] = out.get(root, 0.0) + nbytes / total
        return out

    def save_weights(self, path: str, addresses: Dict[str, str], job: int = 0) -> None:
        """Write the file NETREDUCE_PLACEMENT reads: each root's share of the job's
        bytes under its aggregator's address (``addresses``: topology name ->
        "host:port" as in NETREDUCE_SWITCH). The several-aggregator data path then
        cuts every buffer in these proportions (netreduce/algorithms/multi_aggregator.py)."""
        shares = self.shares(job)
        missing = sorted(set(shares) - set(addresses))
        if missing:
            raise PlannerError(f"no address given for root aggregator(s) {', '.join(missing)}")
        doc = {"policy": self.policy, "job": self.problem.jobs[job].name,
               "congestion_s": self.congestion, "approximation": self.approximation,
               "weights": {addresses[name]: share for name, share in sorted(shares.items())}}
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)

    def edge_loads(self) -> np.ndarray:
        return self.problem.loads(self.problem.choice(self.picks))


def _crc(*parts: object) -> int:
    # BLAKE2b rather than CRC-32: CRC is linear, so names that differ in one
    # character (job0, job1, ...) land on distinct roots far more often than
    # hashing does, which would flatter the fixed policy.
    digest = hashlib.blake2b("/".join(str(p) for p in parts).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


class Policy:
    name = "policy"

    def place(self, topo: Topology, jobs: Sequence[Job]) -> Placement:
        problem = Problem(topo, jobs)
        return self.place_problem(problem)

    def place_problem(self, problem: Problem) -> Placement:
        raise NotImplementedError


class Fixed(Policy):
    name = "fixed"

    def place_problem(self, problem: Problem) -> Placement:
        picks: rounding.Picks = []
        for g, opts in enumerate(problem.options):
            job = problem.jobs[problem.groups[g][0]]
            o = _crc(job.name) % len(opts) if len(problem.jobs) > 1 else 0
            root, _, legs = opts[o]
            picks.append((o, [_crc(src, root) % len(ch) for src, ch in legs]))
        return Placement(self.name, problem, picks, rounding.evaluate(problem, picks))


class Hash(Policy):
    name = "hash"

    def place_problem(self, problem: Problem) -> Placement:
        picks: rounding.Picks = []
        for g, opts in enumerate(problem.options):
            j, c, _ = problem.groups[g]
            name = problem.jobs[j].name
            o = _crc(name, c) % len(opts)
            _, _, legs = opts[o]
            picks.append((o, [_crc(name, c, src) % len(ch) for src, ch in legs]))
        return Placement(self.name, problem, picks, rounding.evaluate(problem, picks))


class Grid(Policy):
    name = "grid"

    def __init__(self, trials: int = 32, seed: int = 0) -> None:
        self.trials = trials
        self.seed = seed

    def place_problem(self, problem: Problem) -> Placement:
        relax = lp.solve(problem)
        best = rounding.round_best(problem, relax.z, self.trials, self.seed)
        return Placement(self.name, problem, best.picks, best.congestion, relax.bound,
                         {"lp_seconds": relax.seconds, "lp_rows": relax.rows,
                          "lp_nonzeros": relax.nonzeros, "variables": problem.nvars,
                          "rounding_mean": best.mean, "rounding_worst": best.worst,
                          "trials": self.trials})


POLICIES = {"fixed": Fixed, "hash": Hash, "grid": Grid}


def policy(name: str, **kwargs: object) -> Policy:
    try:
        return POLICIES[name](**kwargs)  # type: ignore[arg-type]
    except KeyError:
        raise PlannerError(f"unknown placement policy {name!r}; choose one of "
                           f"{', '.join(POLICIES)}") from None
