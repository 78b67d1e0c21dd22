"""The simulation's three experiments, each a list of result rows (dicts).

1. calibration — the emulated testbed's star (``star``: N hosts on a bridge, every
   host link shaped to the same rate, the aggregator's link N x); the comparison
   with the measured runs is benchmarks/sim/calibrate.py.
2. one job on a spine-leaf fabric of racks x hosts_per_rack workers: ring,
   single-aggregator INA, rack + spine INA with fixed, hashed and planned routes.
3. a shared fabric: several jobs, each with a few workers in every rack (a
   fragmented cluster), concurrently: their rings, or INA under each policy."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

from benchmarks.sim import models, scenarios as sc
from netreduce.planner import Job, Topology, from_dict, spine_leaf, split_chunks


def star(n: int, gbps: float, latency_us: float) -> Topology:
    return from_dict({"name": f"testbed-star-{n}", "latency_us": latency_us,
                      "switches": ["bridge"],
                      "hosts": [{"name": f"h{i}", "attach": "bridge", "gbps": gbps}
                                for i in range(n)],
                      "aggregators": [{"name": "agg", "attach": "bridge", "gbps": n * gbps}]})


def fabric(racks: int, hosts_per_rack: int, spines: int, host_gbps: float,
           uplink_gbps: float, latency_us: float) -> Topology:
    topo = Topology(f"spine-leaf {racks}x{hosts_per_rack}, {spines} spines, "
                    f"{host_gbps:g}/{uplink_gbps:g} Gbit/s")
    # switch-resident aggregators at line rate: every port of the switch at once
    spine_leaf(topo, racks, hosts_per_rack, spines, host_gbps, uplink_gbps, latency_us,
               rack_aggregator_gbps=hosts_per_rack * host_gbps + spines * uplink_gbps,
               spine_aggregator_gbps=racks * uplink_gbps)
    return topo


def oversubscription(topo_args: Dict[str, Any]) -> float:
    return (topo_args["hosts_per_rack"] * topo_args["host_gbps"]
            / (topo_args["spines"] * topo_args["uplink_gbps"]))


def single_job(topo_args: Dict[str, Any], model: str, chunk_bytes: int,
               trials: int) -> List[Dict[str, Any]]:
    topo = fabric(**topo_args)
    workers = sc.rack_major(topo)
    grads = models.gradient_bytes(model)
    size = sum(grads)
    base = {"experiment": "single-job", "model": model, "bytes": size, "workers": len(workers),
            "oversubscription": oversubscription(topo_args), **topo_args}
    rows = [dict(base, algorithm="ring", **sc.ring(topo, [workers], [size]))]
    single = Job("job", workers, [size], rack_aggregation=False, candidates=["agg-spine0"])
    rows.append(dict(base, algorithm="ina-single", **sc.ina(sc.place(topo, [single], "fixed"))))
    chunks = split_chunks(grads, chunk_bytes)
    for name in ("fixed", "hash", "grid"):
        job = Job("job", workers, chunks, rack_aggregation=True)
        placement = sc.place(topo, [job], name, trials)
        rows.append(dict(base, algorithm=f"ina-rack-spine-{name}", chunks=len(chunks),
                         planner=placement.stats, **sc.ina(placement)))
    return rows


def shared(topo_args: Dict[str, Any], job_models: Sequence[str], chunk_bytes: int,
           trials: int) -> List[Dict[str, Any]]:
    """len(job_models) jobs; job j owns hosts j*k .. j*k+k-1 of every rack."""
    topo = fabric(**topo_args)
    racks, per_rack = topo_args["racks"], topo_args["hosts_per_rack"]
    k = per_rack // len(job_models)
    if k < 1:
        raise ValueError("more jobs than hosts per rack")
    workers = [[f"r{r}h{j * k + i}" for r in range(racks) for i in range(k)]
               for j in range(len(job_models))]
    grads = [models.gradient_bytes(m) for m in job_models]
    label = job_models[0] if len(set(job_models)) == 1 else "mixed"
    base = {"experiment": "shared", "model": label, "jobs": len(job_models),
            "job_models": list(job_models), "workers_per_job": racks * k,
            "oversubscription": oversubscription(topo_args), **topo_args}
    rows = [dict(base, algorithm="ring",
                 **sc.ring(topo, [sc.rack_major(topo, w) for w in workers],
                           [sum(g) for g in grads]))]
    for name in ("fixed", "hash", "grid"):
        jobs = [Job(f"job{j}-{m}", w, split_chunks(g, chunk_bytes))
                for j, (m, w, g) in enumerate(zip(job_models, workers, grads))]
        placement = sc.place(topo, jobs, name, trials)
        rows.append(dict(base, algorithm=f"ina-rack-spine-{name}", planner=placement.stats,
                         **sc.ina(placement)))
    return rows


def mean_job_time(row: Dict[str, Any]) -> float:
    per = row.get("per_job_s") or [row["time_s"]]
    return sum(per) / len(per)


def reduction(rows: List[Dict[str, Any]], a: str, b: str, key: Optional[str] = None) -> float:
    """1 - time(a)/time(b) over rows of one (experiment, model, fabric) group."""
    t = {r["algorithm"]: mean_job_time(r) for r in rows}
    return 1.0 - t[a] / t[b] if a in t and b in t and t[b] > 0 else math.nan
