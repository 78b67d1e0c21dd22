"""All-reduce algorithms as flows on a topology, timed by SimGrid (engine.py).

* ``ring`` — gloo's/NCCL's ring: 2(N-1) steps, in each every worker sends S/N
  bytes to the next worker (rack-major order, so only rack boundaries cross the
  spine, by an ECMP hash of the pair). The steps are identical sets of flows, so by
  default one step is simulated and multiplied by 2(N-1); ``full=True`` simulates
  every step (the unit test checks the two agree).
* ``ina`` — in-network aggregation along a planner Placement (netreduce.planner):
  every leg (worker -> rack aggregator, rack aggregator -> root, and the results
  back) is a flow, all concurrent. That is the streaming model of a switch
  aggregator: a slot's sum leaves as soon as its last contribution arrives, so
  every hop runs at once and the slowest hop sets the time. SimGrid charges each
  flow its own path latency; the pipeline's depth (up to the root and back) is
  added once on top. Single aggregator, rack + spine with fixed routes and with
  the planner's routes are all placements of this one model.

Wire overhead is explicit: flows carry payload x WIRE[protocol] bytes, the ratio
the emulated testbed's veth counters measured (benchmarks/results/testbed.json)."""
from __future__ import annotations

import collections
import hashlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks.sim import engine
from benchmarks.sim.software import NONE, Software
from netreduce.planner import Job, Placement, Topology, policy

# wire bytes / payload bytes, from the testbed (8 KiB netreduce payloads: 1.0095;
# TCP in 9000-byte frames, gloo's ring: 1.0017-1.005)
WIRE = {"netreduce": 1.0095, "tcp": 1.002}


def edges_of(topo: Topology) -> List[Tuple[float, float]]:
    return [(e.capacity, e.latency) for e in topo.edges]


def ecmp(topo: Topology, src: str, dst: str) -> Tuple[int, ...]:
    paths = topo.paths(src, dst)
    h = hashlib.blake2b(f"{src}>{dst}".encode(), digest_size=8).digest()
    return paths[int.from_bytes(h, "big") % len(paths)]


def ring(topo: Topology, rings: Sequence[Sequence[str]], nbytes: Sequence[int],
         overhead: float = WIRE["tcp"], full: bool = False,
         software: Software = NONE) -> Dict[str, Any]:
    """Concurrent rings (one per job): per job the time of its 2(N-1) steps; with
    ``software.step_s`` every worker spends that long before each step's send."""
    flows: List[List[Any]] = []
    owner: List[int] = []
    steps = []
    for j, (workers, size) in enumerate(zip(rings, nbytes)):
        n = len(workers)
        steps.append(2 * (n - 1))
        for i, w in enumerate(workers):
            nxt = workers[(i + 1) % n]
            flows.append([w, nxt, list(ecmp(topo, w, nxt)), size / n * overhead])
            owner.append(j)
    if len(set(steps)) != 1:
        raise ValueError("concurrent rings must have the same number of workers")
    repeat = 1 if full else steps[0]
    phases = steps[0] if full else 1
    compute = None
    if software.step_s > 0:
        compute = [{w: software.step_s for ws in rings for w in ws}] * phases
    out = engine.run(edges_of(topo), [flows] * phases, flow_ends=True, compute=compute)
    per_job = [0.0] * len(rings)
    for ends in out["flow_ends"]:
        step = [0.0] * len(rings)
        for j, t in zip(owner, ends):
            step[j] = max(step[j], t)
        per_job = [a + b * repeat for a, b in zip(per_job, step)]
    return {"time_s": max(per_job), "per_job_s": per_job, "steps": steps[0],
            "steps_simulated": len(out["durations"]), "flows_per_step": len(flows)}


def ina(placement: Placement, overhead: float = WIRE["netreduce"],
        software: Software = NONE) -> Dict[str, Any]:
    """One all-reduce of every job's chunks along ``placement``; every sender of
    an upward leg (worker, rack aggregator) first spends ``software.seconds`` of
    its payload bytes in software (benchmarks/sim/software.py)."""
    problem = placement.problem
    topo = problem.topo
    merged: Dict[Tuple[int, str, str, Tuple[int, ...]], float] = collections.defaultdict(float)
    depth = [0.0] * len(problem.jobs)
    # fixed legs: worker <-> rack aggregator, job by job
    job_of_worker = {w: j for j, job in enumerate(problem.jobs) for w in job.workers}
    rack_lat = [0.0] * len(problem.jobs)
    up: Dict[str, float] = collections.defaultdict(float)  # payload bytes each sender sends up
    for leg in problem.fixed_legs:
        j = job_of_worker[leg.src] if leg.src in job_of_worker else job_of_worker[leg.dst]
        merged[(j, leg.src, leg.dst, leg.path)] += leg.nbytes * overhead
        if leg.src in job_of_worker:
            up[leg.src] += leg.nbytes
        rack_lat[j] = max(rack_lat[j], topo.latency(leg.path))
    root_lat = [0.0] * len(problem.jobs)
    for g, (opt, paths) in enumerate(placement.picks):
        j, _, size = problem.groups[g]
        root, _, legs = problem.options[g][opt]
        for (src, choice), p in zip(legs, paths):
            path = choice[p][0]
            merged[(j, src, root, path)] += size * overhead
            up[src] += size
            merged[(j, root, src, topo.reverse(path))] += size * overhead
            root_lat[j] = max(root_lat[j], topo.latency(path))
    for j in range(len(problem.jobs)):
        # up and back down the tree, less the one leg SimGrid already charged
        depth[j] = 2 * (rack_lat[j] + root_lat[j]) - max(rack_lat[j], root_lat[j])
    keys = list(merged)
    flows = [[s, d, list(p), merged[(j, s, d, p)]] for j, s, d, p in keys]
    compute = None if software.zero else [{s: software.seconds(b) for s, b in up.items()}]
    out = engine.run(edges_of(topo), [flows], flow_ends=True, compute=compute)
    per_job = [0.0] * len(problem.jobs)
    for (j, _, _, _), t in zip(keys, out["flow_ends"][0]):
        per_job[j] = max(per_job[j], t)
    per_job = [t + d for t, d in zip(per_job, depth)]
    return {"time_s": max(per_job), "per_job_s": per_job, "flows": len(flows),
            "congestion_s": placement.congestion, "lp_bound_s": placement.bound,
            "approximation": placement.approximation, "policy": placement.policy}


def place(topo: Topology, jobs: Sequence[Job], name: str, trials: int = 32,
          seed: int = 0) -> Placement:
    kwargs: Dict[str, Any] = {"trials": trials, "seed": seed} if name == "grid" else {}
    return policy(name, **kwargs).place(topo, jobs)


def rack_major(topo: Topology, workers: Optional[Sequence[str]] = None) -> List[str]:
    """Workers ordered rack by rack (the ring order a topology-aware launcher uses)."""
    workers = list(workers if workers is not None else topo.of_kind("host"))
    order = {w: i for i, w in enumerate(workers)}
    return sorted(workers, key=lambda w: (topo.attachment(w), order[w]))
