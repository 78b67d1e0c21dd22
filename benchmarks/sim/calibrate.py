"""Calibration of the SimGrid model against the emulated testbed (docs/simulation.md).

The wire part of the model has no free parameter (link rates, the veth+bridge
latency and the wire bytes are the testbed's). The host software term
(benchmarks/sim/software.py) has three, found two independent ways:

* **loopback -> testbed**: from a loopback run of benchmarks/allreduce.py at the
  same N (no wire: every rank and the aggregator on the same 2 cores, so time is
  software): netreduce ``op_s`` = the median time of the sizes <= 64 KiB (one packet
  to eight: the per-operation cost), ``packet_s`` = the least-squares slope of
  time over packets at the sizes >= 1 MiB (the per-packet cost at the loopback's
  payload size, so in effect a cost per byte); gloo ``step_s`` = its small-size
  time / 2(N-1). Every testbed size is then a check.
* **testbed fit**: from the testbed itself, on the fit sizes only (256 KiB and
  16 MiB): netreduce's two parameters solve measured - wire = op_s + packets *
  packet_s at those two sizes, gloo's ``step_s`` = (measured - wire) / 2(N-1) at
  256 KiB; every other size is a check.

Either way the fitted numbers go back into SimGrid (an ``exec`` on each sender) and
the simulated times reported are SimGrid's, not the closed form's."""
from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks.sim import experiments as ex, scenarios as sc
from benchmarks.sim.software import NONE, Software
from netreduce.planner import Job, Placement, Problem, from_dict
from netreduce.planner.rounding import evaluate

FIT_SIZES = (256 << 10, 16 << 20)
SMALL = 64 << 10
LARGE = 1 << 20


def gbps_of(rate: str) -> float:
    r = rate.lower()
    if r.endswith("mbit"):
        return float(r[:-4]) / 1000
    if r.endswith("gbit"):
        return float(r[:-4])
    raise ValueError(f"unknown rate {rate!r}")


def records(path: str, impls: Sequence[str] = ("netreduce", "gloo")) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    recs = [r for r in data["records"] if r["impl"] in impls and r.get("correct", True)]
    return data["meta"], recs


def packets(rec: Dict[str, Any], payload: int = 8192) -> int:
    p = rec.get("packets_per_rank")
    return int(round(p)) if p else -(-rec["size"] // payload)


def simulate_star(impl: str, n: int, size: int, gbps: float, latency_us: float,
                  software: Software = NONE) -> float:
    topo = ex.star(n, gbps, latency_us)
    hosts = topo.of_kind("host")
    if impl == "gloo":
        return sc.ring(topo, [hosts], [size], sc.WIRE["tcp"], software=software)["time_s"]
    job = Job("testbed", hosts, [size], rack_aggregation=False)
    return sc.ina(sc.place(topo, [job], "fixed"), sc.WIRE["netreduce"], software)["time_s"]


def from_loopback(path: str) -> Dict[Tuple[str, int], Software]:
    meta, recs = records(path)
    out: Dict[Tuple[str, int], Software] = {}
    for impl in ("netreduce", "gloo"):
        for n in sorted({r["np"] for r in recs if r["impl"] == impl}):
            mine = sorted((r for r in recs if r["impl"] == impl and r["np"] == n),
                          key=lambda r: r["size"])
            small = [r["time_s"] for r in mine if r["size"] <= SMALL]
            if not small or len(mine) < 2:
                continue
            src = f"loopback {meta.get('date', '?')}, N={n}"
            if impl == "gloo":
                out[(impl, n)] = Software(step_s=statistics.median(small) / (2 * (n - 1)),
                                          source=src)
                continue
            big = [r for r in mine if r["size"] >= LARGE]
            if len(big) < 2:
                continue
            xs, ys = [packets(r) for r in big], [r["time_s"] for r in big]
            slope = statistics.linear_regression(xs, ys).slope
            out[(impl, n)] = Software(op_s=statistics.median(small), packet_s=slope,
                                      payload=round(big[-1]["size"] / xs[-1]), source=src)
    return out


def fit_testbed(sim0: Dict[Tuple[str, int, int], float], recs: Sequence[Dict[str, Any]],
                fit_sizes: Sequence[int] = FIT_SIZES) -> Dict[Tuple[str, int], Software]:
    """sim0: (impl, N, size) -> SimGrid time with no software term."""
    out: Dict[Tuple[str, int], Software] = {}
    by = {(r["impl"], r["np"], r["size"]): r for r in recs}
    for impl, n in sorted({(r["impl"], r["np"]) for r in recs}):
        pts = [by[(impl, n, s)] for s in fit_sizes if (impl, n, s) in by]
        if len(pts) < len(fit_sizes):
            continue
        resid = [r["time_s"] - sim0[(impl, n, r["size"])] for r in pts]
        src = f"testbed fit at {', '.join(ex_size(s) for s in fit_sizes)}, N={n}"
        if impl == "gloo":
            out[(impl, n)] = Software(step_s=max(0.0, resid[0]) / (2 * (n - 1)), source=src)
            continue
        (p0, p1), (r0, r1) = [packets(r) for r in pts], resid
        slope = (r1 - r0) / (p1 - p0)
        out[(impl, n)] = Software(op_s=r0 - slope * p0, packet_s=slope,
                                  payload=round(pts[1]["size"] / p1), source=src)
    return out


def ex_size(s: int) -> str:
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"


def star_table(testbed_json: str, latency_us: float, loopback_json: Optional[str],
               sizes: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    meta, recs = records(testbed_json)
    if sizes:
        recs = [r for r in recs if r["size"] in sizes]
    gbps = gbps_of(meta["rate"])
    sim0 = {(r["impl"], r["np"], r["size"]): simulate_star(r["impl"], r["np"], r["size"], gbps,
                                                            latency_us) for r in recs}
    methods: Dict[str, Dict[Tuple[str, int], Software]] = {"testbed-fit": fit_testbed(sim0, recs)}
    if loopback_json:
        ns = {(r["impl"], r["np"]) for r in recs}
        methods["loopback"] = {k: v for k, v in from_loopback(loopback_json).items() if k in ns}
    rows = []
    for r in recs:
        key = (r["impl"], r["np"], r["size"])
        row = {"impl": r["impl"], "np": r["np"], "size": r["size"], "rate": meta["rate"],
               "measured_s": r["time_s"], "wire_only_s": sim0[key],
               "wire_only_error": sim0[key] / r["time_s"] - 1.0}
        for name, params in methods.items():
            sw = params.get((r["impl"], r["np"]))
            if sw is None:
                continue
            t = simulate_star(r["impl"], r["np"], r["size"], gbps, latency_us, sw)
            row[name] = {"simulated_s": t, "error": t / r["time_s"] - 1.0,
                         "role": "fit" if name == "testbed-fit" and r["size"] in FIT_SIZES
                         else "check"}
        rows.append(row)
    params = {name: [dict(impl=k[0], np=k[1], **v.as_dict()) for k, v in sorted(p.items())]
              for name, p in methods.items()}
    return {"testbed": testbed_json, "testbed_date": meta.get("date"),
            "testbed_load": [meta.get("loadavg_at_start"), meta.get("loadavg_at_end")],
            "loopback": loopback_json, "latency_us": latency_us, "fit_sizes": list(FIT_SIZES),
            "parameters": params, "rows": rows}, methods


def multi_table(multi_json: str, latency_us: float, software: Software) -> List[Dict[str, Any]]:
    """The several-aggregator testbed run (benchmarks/multi_aggregator.py), k equal
    ranges of the buffer, range i at aggregator i, with and without ``software``."""
    with open(multi_json, encoding="utf-8") as f:
        data = json.load(f)
    a = data["args"]
    gbps = gbps_of(a["rate"])
    size = int(a["size"][:-1]) << {"K": 10, "M": 20, "G": 30}[a["size"][-1]]
    rows = []
    placements = []
    for rec in data["rows"]:
        k, n = rec["aggregators"], a["np"]
        aggs = [f"agg{i}" for i in range(k)]
        topo = from_dict({"name": f"testbed-{n}+{k}", "latency_us": latency_us,
                          "switches": ["bridge"],
                          "hosts": [{"name": f"h{i}", "attach": "bridge", "gbps": gbps}
                                    for i in range(n)],
                          "aggregators": [{"name": x, "attach": "bridge", "gbps": gbps}
                                          for x in aggs]})
        job = Job("testbed", topo.of_kind("host"), [size // k] * k, rack_aggregation=False,
                  candidates=aggs)
        problem = Problem(topo, [job])
        picks = [(i, [0] * len(problem.options[i][i][2])) for i in range(k)]
        placement = Placement("spread", problem, picks, evaluate(problem, picks))
        placements.append(placement)
        t0 = sc.ina(placement, sc.WIRE["netreduce"])["time_s"]
        t1 = sc.ina(placement, sc.WIRE["netreduce"], software)["time_s"]
        rows.append({"impl": f"netreduce, {k} aggregator(s)", "aggregators": k, "np": n,
                     "size": size, "rate": a["rate"], "measured_s": rec["time_s"],
                     "wire_only_s": t0, "wire_only_error": t0 / rec["time_s"] - 1.0,
                     "simulated_s": t1, "error": t1 / rec["time_s"] - 1.0,
                     "software": software.source})
    # the run's own software term: packet_s from the one-aggregator row (every
    # worker sends the same packets whatever k), op_s kept; k >= 2 are the checks
    one = next((r for r in rows if r["aggregators"] == 1), None)
    if one is not None:
        pk = -(-size // software.payload)
        own = dataclasses.replace(
            software, packet_s=max(0.0, one["measured_s"] - one["wire_only_s"] - software.op_s) / pk,
            source=f"{multi_json}: packet_s fitted on 1 aggregator")
        for r, placement in zip(rows, placements):
            t = sc.ina(placement, sc.WIRE["netreduce"], own)["time_s"]
            r["own_fit"] = {"simulated_s": t, "error": t / r["measured_s"] - 1.0,
                            "role": "fit" if r is one else "check", "packet_s": own.packet_s}
    return rows


def two_level_topology(rate: str, latency_us: float, racks: int = 2, per_rack: int = 2) -> Any:
    """netreduce/testbed/two_level.py's layout: workers and the spine at ``rate``, a
    rack aggregator per rack at (per_rack + 1) x rate; one bridge, so the racks are
    logical (a leaf per rack joined to a core by links that never bind)."""
    g = gbps_of(rate)
    return from_dict({
        "name": f"two-level testbed {racks}x{per_rack}", "latency_us": latency_us,
        "switches": [f"leaf{r}" for r in range(racks)] + ["core"],
        "hosts": [{"name": f"h{r * per_rack + i}", "attach": f"leaf{r}", "gbps": g}
                  for r in range(racks) for i in range(per_rack)],
        "aggregators": [{"name": f"agg-leaf{r}", "level": "rack", "attach": f"leaf{r}",
                         "gbps": g * (per_rack + 1)} for r in range(racks)]
                       + [{"name": "agg-spine", "level": "spine", "attach": "core", "gbps": g}],
        # 4x what a rack can send, 1 us: never binding, never in the way (with a
        # 1 ns latency on these links SimGrid 3.32 gave the flows crossing them
        # wrong shares, e.g. two flows each at a shared link's full rate)
        "links": [{"a": f"leaf{r}", "b": "core", "gbps": 4 * g * (per_rack + 1),
                   "latency_us": 1.0} for r in range(racks)]})


def two_level_table(two_level_json: str, rate: str, size: int, latency_us: float,
                    software: Software) -> List[Dict[str, Any]]:
    with open(two_level_json, encoding="utf-8") as f:
        runs = json.load(f)
    topo = two_level_topology(rate, latency_us)
    workers = topo.of_kind("host")
    jobs = {"single": Job("job", workers, [size], rack_aggregation=False, candidates=["agg-spine"]),
            "tree": Job("job", workers, [size], rack_aggregation=True, candidates=["agg-spine"])}
    rows = []
    for mode, job in jobs.items():
        measured = [r["time_s"] for r in runs if r["mode"] == mode]
        if not measured:
            continue
        m = statistics.mean(measured)
        placement = sc.place(topo, [job], "fixed")
        t0 = sc.ina(placement, sc.WIRE["netreduce"])["time_s"]
        t1 = sc.ina(placement, sc.WIRE["netreduce"], software)["time_s"]
        rows.append({"mode": mode, "np": len(workers), "size": size, "rate": rate,
                     "measured_s": m, "measured_runs_s": measured,
                     "wire_only_s": t0, "wire_only_error": t0 / m - 1.0,
                     "simulated_s": t1, "error": t1 / m - 1.0, "software": software.source})
    by = {r["mode"]: r for r in rows}
    if len(by) == 2:
        for key in ("measured_s", "wire_only_s", "simulated_s"):
            by["tree"][f"speedup_{key}"] = by["single"][key] / by["tree"][key]
    return rows
