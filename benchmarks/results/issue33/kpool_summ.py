#!/usr/bin/env python3
"""kpool's reading of overlap_frameworks.py keras records with MODE%VARIANT modes: per run,
each nr-hvd variant's step over plain nr-hvd's, each compute variant's ranks' CPU and F+B+U
over plain compute's, the CPU floor redone with the variant's compute, and rank 0's CPU and
context switches per step by thread name.   python3 kpool_summ.py RECORD.json [...]"""
import json
import statistics
import sys

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0] + "/benchmarks")
import step_floor  # noqa: E402


def med(v):
    v = [x for x in v if x is not None]
    return f"{statistics.median(v):.4g} ({min(v):.4g}-{max(v):.4g}) n={len(v)}" if v else "-"


def main(paths):
    for path in paths:
        rec = json.load(open(path))
        runs = rec["runs"]
        modes = list(runs[0]["modes"])
        variants = sorted({m.partition("%")[2] for m in modes if "%" in m})
        print(f"# {path}: {len(runs)} runs, modes {modes}")
        rows = {}
        for run in runs:
            res, fl, bnd = run["modes"], run.get("floor") or {}, run.get("bound") or {}
            comm = None
            if "rank_cpu_s" in fl and "S_bytes" in bnd:
                comm = step_floor.comm_cpu_of(fl, 4, fl["round_bytes"], bnd["S_bytes"])["comm_cpu_s"]
            for v in [""] + variants:
                suf = f"%{v}" if v else ""
                nr, cp = res.get("nr-hvd" + suf, {}), res.get("compute" + suf, {})
                cpu = (cp.get("machine_cpu") or {}).get("ranks_cpu_s_per_step")
                floor = step_floor.cpu_floor(cpu, comm, 2) if cpu and comm else None
                r = rows.setdefault(v or "plain", {})
                r.setdefault("nr step", []).append(nr.get("step"))
                r.setdefault("compute F+B+U", []).append(cp.get("step"))
                r.setdefault("compute ranks CPU-s", []).append(cpu)
                r.setdefault("nr ranks CPU-s", []).append((nr.get("machine_cpu") or {}).get("ranks_cpu_s_per_step"))
                r.setdefault("CPU floor (own compute)", []).append(floor)
                r.setdefault("nr step / own floor", []).append(nr["step"] / floor if floor and nr.get("step") else None)
                plain_floor = rows["plain"]["CPU floor (own compute)"][-1]
                r.setdefault("nr step / plain floor", []).append(
                    nr["step"] / plain_floor if plain_floor and nr.get("step") else None)
                if v:
                    p_nr = res.get("nr-hvd", {}).get("step")
                    p_cp = res.get("compute", {}).get("step")
                    r.setdefault("nr step / plain nr step", []).append(
                        nr["step"] / p_nr if p_nr and nr.get("step") else None)
                    r.setdefault("compute F+B+U / plain", []).append(
                        cp["step"] / p_cp if p_cp and cp.get("step") else None)
                for m, x in (("nr", nr), ("cp", cp)):
                    own = x.get("own_cpu") or {}
                    for name, cpu_s in (own.get("by_thread_name") or {}).items():
                        if cpu_s >= 0.02:
                            r.setdefault(f"{m} r0 CPU {name}", []).append(cpu_s)
                    for name, (vol, nv) in (own.get("ctx_switches_per_step") or {}).items():
                        if vol + nv >= 20:
                            r.setdefault(f"{m} r0 ctxsw {name} vol", []).append(vol)
                            r.setdefault(f"{m} r0 ctxsw {name} nonvol", []).append(nv)
                r.setdefault("load", []).extend([nr.get("load", [None])[0], cp.get("load", [None])[0]])
        for v, r in rows.items():
            print(f"## {v}")
            for k, vals in r.items():
                print(f"  {k:40s} {med(vals)}   per run: {[round(x, 3) if x else x for x in vals]}")


if __name__ == "__main__":
    main(sys.argv[1:])
