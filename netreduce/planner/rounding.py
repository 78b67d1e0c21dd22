"""Randomized rounding of the LP relaxation (Raghavan and Thompson; GRID's step 2).

Each chunk independently draws its root with probability x[c,a], then each of its
sources draws a path with probability y[c,a,s,p] / x[c,a]. Every edge's expected
load is then its LP load, and Chernoff bounds keep the maximum within
O(log m / log log m) of the LP optimum with high probability (m edges). We draw
``trials`` independent roundings and keep the least congested — what GRID's
implementation does too — and report the spread, so the approximation obtained is
visible rather than assumed."""
from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

import numpy as np

from netreduce.planner.problem import Problem

Picks = List[Tuple[int, List[int]]]


@dataclasses.dataclass
class Rounded:
    picks: Picks
    congestion: float  # seconds, of the kept rounding
    mean: float  # mean congestion over the trials
    worst: float


def _probs(weights: np.ndarray) -> np.ndarray:
    w = np.clip(weights, 0.0, None)
    total = w.sum()
    return w / total if total > 1e-12 else np.full(len(w), 1.0 / len(w))


def draw(problem: Problem, z: np.ndarray, trials: int, rng: np.random.Generator) -> List[Picks]:
    """``trials`` independent roundings of the fractional vector z."""
    out: List[Picks] = [[] for _ in range(trials)]
    for opts in problem.options:
        px = _probs(np.array([z[xvar] for _, xvar, _ in opts]))
        chosen = rng.choice(len(opts), size=trials, p=px)
        # path draws for every (option, leg) at once, used by the trials that chose it
        paths_by_opt = {}
        for o in np.unique(chosen):
            _, _, legs = opts[o]
            cols = []
            for _, choice in legs:
                if len(choice) == 1:
                    cols.append(np.zeros(trials, dtype=np.int64))
                else:
                    py = _probs(np.array([z[yvar] for _, yvar in choice]))
                    cols.append(rng.choice(len(choice), size=trials, p=py))
            paths_by_opt[o] = np.stack(cols, axis=1) if cols else np.zeros((trials, 0), np.int64)
        for t in range(trials):
            o = int(chosen[t])
            out[t].append((o, paths_by_opt[o][t].tolist()))
    return out


def round_best(problem: Problem, z: np.ndarray, trials: int = 32, seed: int = 0) -> Rounded:
    rng = np.random.default_rng(seed)
    candidates = draw(problem, z, max(1, trials), rng)
    zs = np.stack([problem.choice(p) for p in candidates], axis=1)
    cong = problem.congestion(zs)
    best = int(np.argmin(cong))
    return Rounded(candidates[best], float(cong[best]), float(cong.mean()), float(cong.max()))


def deterministic(problem: Problem, z: np.ndarray) -> Picks:
    """The largest-weight option and paths (argmax rounding), for comparison."""
    picks: Picks = []
    for opts in problem.options:
        o = int(np.argmax([z[xvar] for _, xvar, _ in opts]))
        _, _, legs = opts[o]
        picks.append((o, [int(np.argmax([z[y] for _, y in choice])) if len(choice) > 1 else 0
                          for _, choice in legs]))
    return picks


def evaluate(problem: Problem, picks: Sequence[Tuple[int, Sequence[int]]]) -> float:
    return float(problem.congestion(problem.choice(picks)))
