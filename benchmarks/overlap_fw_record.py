"""The arithmetic and the record of benchmarks/overlap_frameworks.py: a label's mode
(MODE[@CODE][%VARIANT]), a run's bound and its A/B ratios, its CPU floor
(step_floor.py's (d)), the summary over the runs, and the JSON record it writes (or
rewrites: ``--refloor``)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # step_floor and common, imported as the scripts import them
    sys.path.insert(0, HERE)
OUT = os.path.join(HERE, "results", "issue33")


def _plain(label: str) -> str:
    """MODE of a label MODE[@CODE][%VARIANT]."""
    return label.partition("@")[0].partition("%")[0]


def mode_line(label: str, r: Dict[str, Any]) -> str:
    """One run's result of mode ``label`` in a line: the compute mode's F, B and U (any
    @CODE or %VARIANT of it too), another mode's step."""
    if r.get("error"):
        return r["error"]
    if _plain(label) == "compute":
        return f"F {r['forward']:.3f} B {r['backward']:.3f} U {r['update']:.3f} s"
    return f"step {r['step']:.3f} s ({r['step_min_max'][0]:.3f}-{r['step_min_max'][1]:.3f})"


def cpu_floor_of(run: Dict[str, Any], ranks: int, cores: int) -> Optional[Dict[str, Any]]:
    """The run's CPU floor (step_floor's (d), its arithmetic: ``comm_cpu_of``,
    ``cpu_floor``): the compute mode's ranks' CPU-seconds per step (whole processes,
    its stamped whole steps) plus the paced floor's CPU for the step's S gradient bytes
    (``ranks`` floor ranks and the reflector, scaled per byte from the run's ``floor``
    part), over the cores. Beside it, each mode's step over the floor and its own CPU
    per step (ranks, aggregator, machine busy); ``cpu_floor_daemon_s`` puts the
    netreduce mode's measured aggregator in place of the reflector. None without the
    compute mode's CPU, the floor or the bound.

    On a machine that other work shares, the steps and the bound (wall time) stretch
    and the CPU-seconds do not: ``quiet_bound_s`` is the bound with the compute's F, B,
    U scaled by its quiet step over its measured one (the quiet step: its ranks' CPU per
    step over the cores, the cores all theirs; S/R stays), and each
    mode's ``own_cpu_s`` its ranks' and aggregator's CPU per step over the cores, the
    step it would take with the cores to itself and no wait; read those against the
    floor when the load moved."""
    import step_floor
    res, fl, bnd = run.get("modes") or {}, run.get("floor") or {}, run.get("bound") or {}
    comp = (res.get("compute") or {}).get("machine_cpu") or {}
    if comp.get("ranks_cpu_s_per_step") is None or "rank_cpu_s" not in fl or "bound_s" not in bnd:
        return None
    comm = step_floor.comm_cpu_of(fl, ranks, fl["round_bytes"], bnd["S_bytes"])
    floor_s = step_floor.cpu_floor(comp["ranks_cpu_s_per_step"], comm["comm_cpu_s"], cores)
    out: Dict[str, Any] = {
        "compute_ranks_cpu_s": comp["ranks_cpu_s_per_step"], "compute_busy": comp.get("busy_fraction"),
        "comm_rank_cpu_s": comm["rank_cpu_s"], "comm_aggregator_cpu_s": comm["aggregator_cpu_s"],
        "comm_cpu_s": comm["comm_cpu_s"], "cores": cores, "cpu_floor_s": round(floor_s, 5),
        "bound_s": bnd["bound_s"], "cpu_floor_vs_bound": round(floor_s / bnd["bound_s"], 4),
        "target_vs_cpu_floor": round(1.1 * bnd["bound_s"] / floor_s, 4)}
    wall = (res.get("compute") or {}).get("step")  # F + B + U, the loop that timed them
    if wall and all(k in bnd for k in ("forward", "backward", "update", "transfer")):
        k = comp["ranks_cpu_s_per_step"] / cores / wall
        quiet = k * bnd["forward"] + max(k * bnd["backward"], bnd["transfer"]) + k * bnd["update"]
        out.update(quiet_bound_s=round(quiet, 5), quiet_target_vs_cpu_floor=round(1.1 * quiet / floor_s, 4))
    for mode, rec in res.items():
        mc = rec.get("machine_cpu") or {}
        if _plain(mode) == "compute" or not rec.get("step"):
            continue
        out[f"{mode}_vs_cpu_floor"] = round(rec["step"] / floor_s, 4)
        out[f"{mode}_busy"] = mc.get("busy_fraction")
        out[f"{mode}_ranks_cpu_s"] = mc.get("ranks_cpu_s_per_step")
        out[f"{mode}_cpu_bound_s"] = mc.get("cpu_bound_s")  # all the machine's CPU / cores
        if mc.get("ranks_cpu_s_per_step") is not None:  # what the ranks spend past the compute
            out[f"{mode}_ranks_cpu_over_compute_s"] = round(
                mc["ranks_cpu_s_per_step"] - comp["ranks_cpu_s_per_step"], 4)
        if mc.get("ranks_cpu_s_per_step") is not None:
            own = (mc["ranks_cpu_s_per_step"] + (mc.get("aggregator_cpu_s_per_step") or 0.0)) / cores
            out[f"{mode}_own_cpu_s"] = round(own, 5)
            out[f"{mode}_own_cpu_vs_cpu_floor"] = round(own / floor_s, 4)
        if mc.get("aggregator_cpu_s_per_step") is not None:
            out[f"{mode}_aggregator_cpu_s"] = mc["aggregator_cpu_s_per_step"]
            daemon = step_floor.cpu_floor(comp["ranks_cpu_s_per_step"], ranks * comm["rank_cpu_s"]
                                          + mc["aggregator_cpu_s_per_step"], cores)
            out[f"{mode}_cpu_floor_daemon_s"] = round(daemon, 5)
    return out



def bound_of(run: Dict[str, Any], res: Dict[str, Any], modes: List[str], rate: float) -> None:
    """The run's bound F + max(B, S/R) + U from its compute mode, and each mode's step
    over it (``MODE_step_vs_bound``), into ``run``."""
    comp = res.get("compute", {})
    if "forward" in comp:
        s_bytes = 4 * comp["params"]
        transfer = s_bytes * 8 / rate
        run["bound"] = {"forward": comp["forward"], "backward": comp["backward"],
                        "update": comp["update"], "S_bytes": s_bytes,
                        "transfer": round(transfer, 5),
                        "bound_s": round(comp["forward"] + max(comp["backward"], transfer)
                                         + comp["update"], 5)}
        for mode in modes:
            if res.get(mode, {}).get("step"):
                run[f"{mode}_step_vs_bound"] = round(res[mode]["step"]
                                                     / run["bound"]["bound_s"], 4)


def ab_ratios(run: Dict[str, Any], res: Dict[str, Any], modes: List[str]) -> None:
    """Into ``run``: each netreduce mode's speedup over the framework's own path, MODE
    against MODE@CODE (two checkouts), MODE%VARIANT against MODE (its step and its
    ranks' CPU)."""
    peer = next((m for m in modes if not m.startswith("nr-") and _plain(m) != "compute"), None)
    for mode in [m for m in modes if m.startswith("nr-")]:
        if peer and res.get(mode, {}).get("step") and res.get(peer, {}).get("step"):
            run[f"{mode}_speedup_vs_{peer}"] = round(res[peer]["step"] / res[mode]["step"], 4)
    for label in [m for m in modes if "@" in m]:  # A/B: MODE against MODE@CODE
        mode = _plain(label)
        if res.get(mode, {}).get("step") and res.get(label, {}).get("step"):
            run[f"{mode}_speedup_vs_{label}"] = round(res[label]["step"] / res[mode]["step"], 4)
    for label in [m for m in modes if "%" in m]:  # A/B: MODE%VARIANT against MODE
        plain = label.partition("%")[0]
        a, b = res.get(plain, {}), res.get(label, {})
        if a.get("step") and b.get("step"):
            run[f"{label}_step_vs_{plain}"] = round(b["step"] / a["step"], 4)
        ca, cb = [(x.get("machine_cpu") or {}).get("ranks_cpu_s_per_step") for x in (a, b)]
        if ca and cb:
            run[f"{label}_ranks_cpu_vs_{plain}"] = round(cb / ca, 4)


def refloor(path: str) -> None:
    """RECORD's runs' CPU floors (``cpu_floor_of``, this file's arithmetic) and its
    summary again, in place."""
    with open(path) as f:
        record = json.load(f)
    s = record["summary"]
    for run in record["runs"]:
        run["cpu_floor"] = cpu_floor_of(run, s["ranks"], (run.get("floor") or {}).get("cores")
                                        or os.cpu_count() or 1)
    modes = list(record["runs"][0]["modes"])
    words = record["command"].split()
    ns = argparse.Namespace(target=s["target"], rate=s["rate"], mtu=s["mtu"], np=s["ranks"],
                            batch_size=s["batch"], commit=record.get("commit", ""),
                            steps=int(words[words.index("--steps") + 1]) if "--steps" in words else 5,
                            warmup=int(words[words.index("--warmup") + 1]) if "--warmup" in words else 2,
                            out=path)
    write(ns, modes, record["runs"], path, record["command"])
    print(json.dumps(json.load(open(path))["summary"].get("cpu_floor"), indent=1))


def write(args: argparse.Namespace, modes: List[str], runs: List[Dict[str, Any]],
          path: str, command: str = "") -> str:
    import common
    summary: Dict[str, Any] = {"target": args.target, "rate": args.rate, "mtu": args.mtu,
                               "ranks": args.np, "batch": args.batch_size, "model": "alexnet"}
    for key in sorted({k for r in runs for k in r if "_vs_" in k}):
        summary[key] = common.spread([r.get(key) for r in runs])
    for part in ("forward", "backward", "update", "transfer", "bound_s"):
        summary[part] = common.spread([(r.get("bound") or {}).get(part) for r in runs])
    for mode in modes:
        recs = [r["modes"][mode] for r in runs if mode in r["modes"]]
        summary[mode] = {"step_s": common.spread([x.get("step") for x in recs]),
                         "cpu_s_rank0": common.spread([x.get("cpu_s") for x in recs], 2),
                         "wire_tx_per_step_MB": common.spread(
                             [x["wire_tx"] / (args.steps + args.warmup) / 1e6
                              if x.get("wire_tx") else None for x in recs], 1)}
        for part in ("busy_fraction", "ranks_cpu_s_per_step", "aggregator_cpu_s_per_step",
                     "cpu_bound_s"):
            summary[mode]["machine_cpu." + part] = common.spread(
                [(x.get("machine_cpu") or {}).get(part) for x in recs])
        tls = [x["timeline"]["median"] for x in recs if x.get("timeline")]
        if tls:
            summary[mode]["timeline_ms"] = {k: common.spread([t.get(k) for t in tls], 1)
                                            for k in tls[0]}
    floors = [r["cpu_floor"] for r in runs if r.get("cpu_floor")]
    if floors:
        summary["cpu_floor"] = {k: common.spread([f.get(k) for f in floors])
                                for k in floors[0] if k != "cores"}
    summary["load_1min"] = common.spread([x["load"][0] for r in runs for x in r["modes"].values()], 2)
    os.makedirs(OUT, exist_ok=True)
    path = path or args.out or os.path.join(
        OUT, f"overlap_{args.target}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    with open(path, "w") as f:
        json.dump({"command": command or "python3 benchmarks/overlap_frameworks.py " + " ".join(sys.argv[1:]),
                   "commit": args.commit, "summary": summary, "runs": runs}, f, indent=1)
    return path

