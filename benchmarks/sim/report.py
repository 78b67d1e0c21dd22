"""Tables and the plot of a simulation result (benchmarks/simulate.py)."""
from __future__ import annotations

import collections
from typing import Any, Dict, List

from benchmarks.sim import calib_report, experiments as ex

# Compute time per training step, for the training-time estimate only: order-of-
# magnitude fp32 figures for one V100-class GPU (AlexNet batch 128, ResNet-50 batch
# 64, BERT-base batch 32 x 128 tokens). ASSUMED, not measured here; the estimate
# takes step = compute + communication (no overlap), which favours the faster
# all-reduce most.
COMPUTE_S = {"alexnet": 0.045, "resnet50": 0.17, "bert-base": 0.18}
ALGOS = ["ring", "ina-single", "ina-rack-spine-fixed", "ina-rack-spine-hash",
         "ina-rack-spine-grid"]


def _groups(rows: List[Dict[str, Any]], experiment: str) -> Dict[tuple, Dict[str, Any]]:
    out: Dict[tuple, Dict[str, Any]] = collections.defaultdict(dict)
    for r in rows:
        if r["experiment"] == experiment:
            out[(r["uplink_gbps"], r["model"])][r["algorithm"]] = r
    return out


def _ms(r: Dict[str, Any], key: str = "time_s") -> str:
    return f"{r[key] * 1e3:.2f}" if r else "-"


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def markdown(result: Dict[str, Any]) -> str:
    meta, calib, rows = result["meta"], result["calibration"], result["rows"]
    out = [f"### SimGrid flow-level simulation ({meta['date']})", "",
           f"- command: `{meta['command']}` ({meta['seconds']} s)",
           f"- model: SimGrid {meta['simgrid_model']}; load average at start/end "
           f"{'/'.join(f'{x:.1f}' for x in meta['loadavg_at_start'])} / "
           f"{'/'.join(f'{x:.1f}' for x in meta['loadavg_at_end'])}", ""]
    if calib:
        out += calib_report.markdown(calib)
        out.append("")
    single = _groups(rows, "single-job")
    if single:
        out += ["#### One job on the whole fabric: communication time per step (ms)", "",
                "| uplinks | oversub. | model | ring | single aggregator | rack+spine fixed | "
                "rack+spine hash | rack+spine planner | ring / planner | LP bound | "
                "rounded / LP |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for (up, model), g in sorted(single.items()):
            r0 = next(iter(g.values()))
            grid = g["ina-rack-spine-grid"]
            out.append(f"| {up:g} G | {r0['oversubscription']:g}:1 | {model} | "
                       + " | ".join(_ms(g.get(a, {})) for a in ALGOS)
                       + f" | {g['ring']['time_s'] / grid['time_s']:.2f}x | "
                       f"{grid['lp_bound_s'] * 1e3:.2f} | {grid['approximation']:.3f} |")
        out.append("")
    shared = _groups(rows, "shared")
    if shared:
        out += ["#### Jobs sharing the fabric: mean communication time per job and step (ms)",
                "", "| uplinks | oversub. | models | ring | fixed | hash | planner | "
                "planner vs fixed | planner vs hash | rounded / LP | LP s |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for (up, model), g in sorted(shared.items()):
            r0 = next(iter(g.values()))
            grid = g["ina-rack-spine-grid"]
            t = {a: ex.mean_job_time(r) for a, r in g.items()}
            out.append(
                f"| {up:g} G | {r0['oversubscription']:g}:1 | {r0['jobs']} x {model} | "
                f"{t['ring'] * 1e3:.2f} | {t['ina-rack-spine-fixed'] * 1e3:.2f} | "
                f"{t['ina-rack-spine-hash'] * 1e3:.2f} | {t['ina-rack-spine-grid'] * 1e3:.2f} | "
                f"{-ex.reduction(list(g.values()), 'ina-rack-spine-grid', 'ina-rack-spine-fixed') * 100:+.1f} % | "
                f"{-ex.reduction(list(g.values()), 'ina-rack-spine-grid', 'ina-rack-spine-hash') * 100:+.1f} % | "
                f"{grid['approximation']:.3f} | {grid['planner']['lp_seconds']:.2f} |")
        out.append("")
    if single or shared:
        out += training(single, shared)
    return "\n".join(out) + "\n"


def training(single: Dict[tuple, Dict[str, Any]], shared: Dict[tuple, Dict[str, Any]]) -> List[str]:
    out = ["#### Training step estimate (ASSUMED compute per step, no overlap)", "",
           "| uplinks | model | compute s | one job: ring -> planner INA | shared: fixed -> planner |",
           "|---|---|---|---|---|"]
    for (up, model), g in sorted(single.items()):
        c = COMPUTE_S.get(model)
        if c is None:
            continue
        ring = c + g["ring"]["time_s"]
        ina = c + g["ina-rack-spine-grid"]["time_s"]
        s = shared.get((up, model), {})
        sh = "-"
        if s:
            fixed = c + ex.mean_job_time(s["ina-rack-spine-fixed"])
            plan = c + ex.mean_job_time(s["ina-rack-spine-grid"])
            sh = f"{fixed / plan:.2f}x"
        out.append(f"| {up:g} G | {model} | {c} | {ring / ina:.2f}x | {sh} |")
    return out + [""]


def plot(result: Dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = result["rows"]
    single, shared = _groups(rows, "single-job"), _groups(rows, "shared")
    ups = sorted({k[0] for k in single} | {k[0] for k in shared})
    fig, axes = plt.subplots(len(ups), 2, figsize=(13, 4.2 * len(ups)), squeeze=False)
    for i, up in enumerate(ups):
        for ax, groups, algos, title in (
                (axes[i][0], single, ALGOS, "one job on every host"),
                (axes[i][1], shared, ["ring", "ina-rack-spine-fixed", "ina-rack-spine-hash",
                                      "ina-rack-spine-grid"], "jobs sharing the fabric (mean per job)")):
            keys = sorted(k for k in groups if k[0] == up)
            width = 0.8 / len(algos)
            for a, algo in enumerate(algos):
                ys = [ex.mean_job_time(groups[k][algo]) * 1e3 if algo in groups[k] else 0
                      for k in keys]
                ax.bar([x + a * width for x in range(len(keys))], ys, width,
                       label=algo.replace("ina-rack-spine-", "rack+spine "))
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(keys))])
            ax.set_xticklabels([k[1] for k in keys])
            ax.set_yscale("log")
            ax.set_ylabel("communication ms / step")
            over = next(iter(groups[keys[0]].values()))["oversubscription"] if keys else 0
            ax.set_title(f"{title}; uplinks {up:g} Gbit/s ({over:g}:1)")
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=7)
    a = result["meta"]["args"]
    fig.suptitle(f"SimGrid flow-level model: spine-leaf, {a['racks']} racks x "
                 f"{a['hosts_per_rack']} hosts, {a['spines']} spines, "
                 f"{a['host_gbps']:g} Gbit/s hosts")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
