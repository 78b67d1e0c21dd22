#!/usr/bin/env python3
"""Plot benchmark records written by benchmarks/allreduce.py --json.

    python benchmarks/plot.py benchmarks/results/testbed.json -o benchmarks/results/testbed.png

Left: busbw vs message size, one line per implementation and world size (a dashed
line at the link rate in testbed mode). Right: speed-up of netreduce over each other
implementation (other time / netreduce time) per size, bars grouped by N, with the
INA theory 2(N-1)/N as a marker."""
from __future__ import annotations

import argparse
import json
import sys
from typing import List

COLORS = {"netreduce": "#d62728", "gloo": "#1f77b4", "mpi": "#2ca02c", "horovod": "#9467bd"}
MARKERS = ["o", "s", "^", "D"]


def _size_label(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n // scale}{unit}"
    return str(n)


def plot(meta: dict, records: List[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nps = sorted({r["np"] for r in records})
    impls = [i for i in ("netreduce", "gloo", "mpi", "horovod") if any(r["impl"] == i for r in records)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))

    for k, n in enumerate(nps):
        for impl in impls:
            rs = sorted((r for r in records if r["np"] == n and r["impl"] == impl), key=lambda r: r["size"])
            if not rs:
                continue
            ax1.plot([r["size"] for r in rs], [r["busbw_GBps"] for r in rs],
                     color=COLORS.get(impl), marker=MARKERS[k % len(MARKERS)],
                     linestyle="-" if k == 0 else "--", label=f"{impl} N={n}")
    if meta.get("mode") == "testbed" and meta.get("rate"):
        sys.path.insert(0, __file__.rsplit("/", 2)[0])
        from netreduce.testbed.plan import parse_rate
        rate = parse_rate(meta["rate"]) / 8e9
        ax1.axhline(rate, color="gray", linestyle=":", label=f"link rate {meta['rate']} (a ring's busbw ceiling)")
    ax1.set_xscale("log", base=2)
    sizes = sorted({r["size"] for r in records})
    ax1.set_xticks(sizes)
    ax1.set_xticklabels([_size_label(s) for s in sizes], rotation=45)
    ax1.set_xlabel("message size (bytes, float32)")
    ax1.set_ylabel("busbw (GB/s) = S/t x 2(N-1)/N")
    ax1.set_title(f"all-reduce busbw, {meta.get('mode', '')}"
                  + (f", {meta.get('rate')} per host" if meta.get("mode") == "testbed" else ""))
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)

    others = [i for i in impls if i != "netreduce"]
    groups = [(n, o) for n in nps for o in others]
    width = 0.8 / max(len(groups), 1)
    for g, (n, o) in enumerate(groups):
        xs, ys = [], []
        for j, s in enumerate(sizes):
            nr = next((r for r in records if r["impl"] == "netreduce" and r["np"] == n and r["size"] == s), None)
            ot = next((r for r in records if r["impl"] == o and r["np"] == n and r["size"] == s), None)
            if nr and ot and nr["time_s"] > 0:
                xs.append(j + (g - (len(groups) - 1) / 2) * width)
                ys.append(ot["time_s"] / nr["time_s"])
        ax2.bar(xs, ys, width=width, color=COLORS.get(o), alpha=0.45 + 0.5 * (nps.index(n) / max(len(nps) - 1, 1)),
                label=f"vs {o}, N={n}")
    for n in nps:
        ax2.axhline(2 * (n - 1) / n, linestyle=":", color="black", alpha=0.5)
        ax2.text(len(sizes) - 0.5, 2 * (n - 1) / n, f"INA theory vs ring, N={n}", fontsize=7, va="bottom", ha="right")
    ax2.axhline(1.0, color="gray", linewidth=0.8)
    ax2.set_xticks(range(len(sizes)))
    ax2.set_xticklabels([_size_label(s) for s in sizes], rotation=45)
    ax2.set_xlabel("message size")
    ax2.set_ylabel("speed-up = other time / netreduce time")
    ax2.set_title("netreduce speed-up (>1: netreduce faster)")
    ax2.grid(True, axis="y", alpha=0.3)
    ax2.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{meta.get('machine', {}).get('cpu', '')} x{meta.get('machine', {}).get('cores', '')}, "
                 f"{meta.get('date', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="records from benchmarks/allreduce.py --json")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    args = ap.parse_args(argv)
    with open(args.json) as f:
        data = json.load(f)
    plot(data["meta"], data["records"], args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
