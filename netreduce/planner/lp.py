"""The LP relaxation of the routing problem, solved by HiGHS through scipy.

    minimise   T
    subject to sum_a x[c,a] = 1                      every chunk has one root
               sum_p y[c,a,s,p] = x[c,a]             a source with several paths
                                                     splits its share among them
               fixed[e] + (A z)[e] <= T * cap[e]     every directed edge
               0 <= x, y <= 1

T is in seconds (loads are bytes, capacities bytes per second), so the optimum is a
lower bound on the time of the most loaded link under ANY integral placement: the
yardstick the rounded placement's approximation is measured against. The
multi-commodity constraints are GRID's; only the names are ours."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from netreduce.planner.problem import Problem
from netreduce.planner.topology import PlannerError


@dataclasses.dataclass
class Relaxation:
    bound: float  # seconds: the LP optimum T*
    z: np.ndarray  # fractional x and y, indexed like Problem's variables
    seconds: float  # solver wall time
    rows: int
    nonzeros: int


def solve(problem: Problem) -> Relaxation:
    n = problem.nvars
    t_col = n  # the last column is T
    cap = problem.capacity
    # Only edges some variable touches need a row; the others bound T from below.
    touched = np.unique(problem.incidence.nonzero()[0])
    floor = float((problem.fixed / cap).max())
    a_edge = problem.incidence[touched]
    a_ub = sp.hstack([a_edge, sp.csr_matrix(-cap[touched][:, None])], format="csr")
    b_ub = -problem.fixed[touched]

    # equality rows: one per chunk (its roots sum to 1), one per multi-path leg
    rows, cols, vals, b_eq = [], [], [], []
    r = 0
    for opts in problem.options:
        for _, xvar, _ in opts:
            rows.append(r)
            cols.append(xvar)
            vals.append(1.0)
        b_eq.append(1.0)
        r += 1
        for _, xvar, legs in opts:
            for _, choice in legs:
                if len(choice) < 2:
                    continue
                for _, yvar in choice:
                    rows.append(r)
                    cols.append(yvar)
                    vals.append(1.0)
                rows.append(r)
                cols.append(xvar)
                vals.append(-1.0)
                b_eq.append(0.0)
                r += 1
    a_eq = sp.csr_matrix((vals, (rows, cols)), shape=(r, n + 1))
    c = np.zeros(n + 1)
    c[t_col] = 1.0
    bounds = [(0.0, 1.0)] * n + [(floor, None)]
    start = time.perf_counter()
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.array(b_eq),
                  bounds=bounds, method="highs")
    took = time.perf_counter() - start
    if res.status != 0:
        raise PlannerError(f"the LP relaxation failed ({res.message}); "
                           f"{len(problem.groups)} chunks, {n} variables")
    z = np.clip(res.x[:n], 0.0, 1.0)
    return Relaxation(float(res.x[t_col]), z, took, a_ub.shape[0] + r,
                      a_ub.nnz + a_eq.nnz)
