#!/usr/bin/env python3
"""The aggregator's per-packet path alone, A/B between checkouts (issue 33): builds
benchmarks/aggregator_path.cc against each tree's native sources (-O3, as setup.py),
then runs the builds in alternation and reports each one's best ns per contribution
(thread CPU clock, no kernel work: see the .cc). Where the whole daemon's cost is too
noisy to compare on a shared machine, this shows the user-space part of a change.

    python3 benchmarks/aggregator_path.py --tree base=/tmp/base --tree new=. --rounds 5 \\
        --json benchmarks/results/issue33/aggregator_path.json
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["native/aggregator/*.cc", "native/wire/roce.cc", "native/reduce/kernels.cc",
           "native/transport/udp/*.cc", "native/transport/make_transport.cc"]


def build(tree: str, out_dir: str) -> str:
    tree = os.path.abspath(tree)
    srcs = sorted(f for pat in SOURCES for f in glob.glob(os.path.join(tree, pat)))
    key = hashlib.sha256()
    for f in srcs + [os.path.join(HERE, "aggregator_path.cc")]:
        with open(f, "rb") as fh:
            key.update(fh.read())
    for f in sorted(glob.glob(os.path.join(tree, "native", "**", "*.h"), recursive=True)):
        with open(f, "rb") as fh:
            key.update(fh.read())
    exe = os.path.join(out_dir, "aggregator_path_" + key.hexdigest()[:16])
    if os.path.exists(exe):
        return exe
    crc = []
    if glob.glob("/usr/include/isa-l*") or os.path.exists("/usr/include/isa-l.h"):
        crc = ["-DNETREDUCE_HAVE_ISAL", "-lisal"]
    cmd = (["g++", "-O3", "-std=c++17", "-fwrapv", "-DNDEBUG", "-I" + os.path.join(tree, "native"),
            "-o", exe + ".tmp", os.path.join(HERE, "aggregator_path.cc")] + srcs + crc
           + ["-lz", "-lpthread"])
    subprocess.run(cmd, check=True)
    os.replace(exe + ".tmp", exe)
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=CHECKOUT (repeatable)")
    ap.add_argument("--rounds", type=int, default=5, help="alternations of the builds")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--payload", type=int, default=1432, help="P (1432 = MTU 1500)")
    ap.add_argument("--size", type=int, default=64 << 20, help="message bytes")
    ap.add_argument("--repeats", type=int, default=3, help="messages per run (best counts)")
    ap.add_argument("--window", default="0",
                    help="slots in use, comma-separated (each one a case of every tree); 0 = "
                         "all the job's slots, as the daemon's default window")
    ap.add_argument("--lag", default="",
                    help="how far rank r trails rank 0: r x LAG chunks, or 'Fw' for rank 0 "
                         "leading the last rank by F of the window; unset: one run (44 at 1432 B)")
    ap.add_argument("--build-dir", default=os.path.expanduser("~/.cache/netreduce/aggregator_path"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    os.makedirs(args.build_dir, exist_ok=True)
    trees = [t.split("=", 1) for t in args.tree]
    exes = {name: build(path, args.build_dir) for name, path in trees}
    windows = [int(w) for w in args.window.split(",")]
    # One case per tree and window; a case's name is the tree's, with /wW when several.
    cases = [(name if len(windows) == 1 else f"{name}/w{w}", name, w)
             for name, _ in trees for w in windows]
    runs = []
    for rnd in range(args.rounds):
        for case, name, window in cases:
            load = os.getloadavg()[0]
            cmd = [exes[name], str(args.ranks), str(args.payload), str(args.size), str(args.repeats)]
            if window or args.lag:
                cmd += [str(window)] + ([args.lag] if args.lag else [])
            p = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rec = dict(json.loads(p.stdout), tree=name, case=case, round=rnd, load=load)
            runs.append(rec)
            print(f"  [{case}] {rec['ns_per_contribution']:.1f} ns per contribution, "
                  f"{rec['GB_per_cpu_s']:.2f} GB/CPU-s, load {load:.1f}", flush=True)
    summary = {}
    for case, _, _ in cases:
        ns = [r["ns_per_contribution"] for r in runs if r["case"] == case]
        summary[case] = {"ns_per_contribution": {"median": round(statistics.median(ns), 2),
                                                 "min": round(min(ns), 2), "max": round(max(ns), 2),
                                                 "n": len(ns)}}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                       "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "trees": dict(trees), "summary": summary, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
