"""Markdown of the calibration (benchmarks/sim/calibrate.py) for simulation.md."""
from __future__ import annotations

from typing import Any, Dict, List


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def _params(star: Dict[str, Any]) -> List[str]:
    out = ["Software term (benchmarks/sim/software.py), per method:", "",
           "| method | impl | N | op_s ms | packet_s us | payload B | step_s ms | from |",
           "|---|---|---|---|---|---|---|---|"]
    for method, ps in star["parameters"].items():
        for p in ps:
            out.append(f"| {method} | {p['impl']} | {p['np']} | {p['op_s'] * 1e3:.3f} | "
                       f"{p['packet_s'] * 1e6:.2f} | {p['payload']} | {p['step_s'] * 1e3:.3f} | "
                       f"{p['source']} |")
    return out + [""]


def star_rows(star: Dict[str, Any]) -> List[str]:
    methods = list(star["parameters"])
    head = "| impl | N | size | measured ms | wire only ms (err) |" + "".join(
        f" {m} ms (err) |" for m in methods)
    load = " -> ".join("/".join(f"{x:.1f}" for x in la) for la in star["testbed_load"] if la)
    out = [f"Testbed star `{star['testbed']}` ({star['testbed_date']}, load "
           f"{load}); fit sizes "
           f"{', '.join(_size(s) for s in star['fit_sizes'])} (marked *fit*), the rest checks:",
           "", head, "|---|---|---|---|---|" + "---|" * len(methods)]
    for r in star["rows"]:
        line = (f"| {r['impl']} | {r['np']} | {_size(r['size'])} | {r['measured_s'] * 1e3:.2f} | "
                f"{r['wire_only_s'] * 1e3:.2f} ({_pct(r['wire_only_error'])}) |")
        for m in methods:
            c = r.get(m)
            line += (f" {c['simulated_s'] * 1e3:.2f} ({_pct(c['error'])}"
                     f"{', fit' if c['role'] == 'fit' else ''}) |" if c else " - |")
        out.append(line)
    out.append("")
    for m in methods:
        checks = [(r, r[m]) for r in star["rows"] if m in r and r[m]["role"] == "check"]
        if checks:
            worst = max(checks, key=lambda rc: abs(rc[1]["error"]))
            out.append(f"- {m}: largest |error| over its checks {abs(worst[1]['error']) * 100:.1f} % "
                       f"({worst[0]['impl']} N={worst[0]['np']} {_size(worst[0]['size'])}); "
                       f"{sum(abs(c['error']) <= 0.15 for _, c in checks)}/{len(checks)} "
                       f"checks within 15 %")
    return out + [""]


def markdown(calib: Dict[str, Any]) -> List[str]:
    out = ["#### Calibration: the emulated testbed, simulated vs measured", ""]
    for star in calib.get("star", []):
        out += _params(star) + star_rows(star)
    multi = calib.get("multi") or []
    if multi:
        out += ["Several aggregators (multi_aggregator_testbed.json), software term: "
                f"{multi[0]['software']}:", "",
                "| run | N | size | measured ms | wire only ms (err) | with software ms (err) "
                "| packet_s refitted on 1 aggregator ms (err) |",
                "|---|---|---|---|---|---|---|"]
        for r in multi:
            own = r.get("own_fit")
            tail = (f"{own['simulated_s'] * 1e3:.1f} ({_pct(own['error'])}"
                    f"{', fit' if own['role'] == 'fit' else ''})" if own else "-")
            out.append(f"| {r['impl']} | {r['np']} | {_size(r['size'])} | "
                       f"{r['measured_s'] * 1e3:.1f} | {r['wire_only_s'] * 1e3:.1f} "
                       f"({_pct(r['wire_only_error'])}) | {r['simulated_s'] * 1e3:.1f} "
                       f"({_pct(r['error'])}) | {tail} |")
        own = multi[0].get("own_fit")
        if own:
            out.append(f"\nRefitted packet_s = {own['packet_s'] * 1e6:.1f} us.")
        out.append("")
    two = calib.get("two_level") or []
    if two:
        out += ["Rack + spine (two_level_testbed.json: 2 racks x 2 hosts), software term: "
                f"{two[0]['software']}:", "",
                "| mode | size | measured ms | wire only ms (err) | with software ms (err) |",
                "|---|---|---|---|---|"]
        for r in two:
            out.append(f"| {r['mode']} | {_size(r['size'])} | {r['measured_s'] * 1e3:.1f} | "
                       f"{r['wire_only_s'] * 1e3:.1f} ({_pct(r['wire_only_error'])}) | "
                       f"{r['simulated_s'] * 1e3:.1f} ({_pct(r['error'])}) |")
        tree = next((r for r in two if "speedup_measured_s" in r), None)
        if tree:
            out.append(f"\nTree / one aggregator: measured {tree['speedup_measured_s']:.2f}x, "
                       f"simulated {tree['speedup_simulated_s']:.2f}x "
                       f"(wire only {tree['speedup_wire_only_s']:.2f}x).")
        out.append("")
    return out
