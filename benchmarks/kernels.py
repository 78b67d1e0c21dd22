"""The slot kernels' CPU per GB, two versions of native/reduce/kernels.cc side by side:
the working tree's and a git revision's, each on its AVX2 path and on the generic one
(cpuid's answer forced to "no"), run in alternation (A B B A ...) so that a loaded
machine weighs on both alike. Medians and spreads per path, dtype and op, and the
ratio new/old of each pair's medians.

    python benchmarks/kernels.py [--baseline REV] [--rounds 5] [--payload 1432]
        [--ranks 4] [--gb 0.5] [--dtypes float32,...] [--ops sum,min,max]
        [--json benchmarks/results/kernels_ab.json]

What it runs is benchmarks/kernels_bench.cc (the aggregator's batch of contributions
folded into a job's slots), compiled with the extension's flags (-O3 -fwrapv)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import command_line, machine_description, utc_now, write_json  # noqa: E402

FLAGS = ["-std=c++17", "-O3", "-fwrapv", "-Wall", "-Wno-unused-function"]
FORCE_GENERIC = "-D__builtin_cpu_supports(x)=0"  # the dispatch's cpuid says no AVX2


def _sources(rev: str, into: str) -> str:
    """native/reduce/{dtype.h,kernels.cc} of `rev` ("" = the working tree) in `into`."""
    if not rev:
        return os.path.join(ROOT, "native")
    os.makedirs(os.path.join(into, "reduce"), exist_ok=True)
    for name in ("dtype.h", "kernels.cc"):
        text = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:native/reduce/{name}"],
                              check=True, capture_output=True, text=True).stdout
        with open(os.path.join(into, "reduce", name), "w") as f:
            f.write(text)
    return into


def build(rev: str, generic: bool, work: str) -> str:
    tag = (rev or "tree").replace("/", "_") + ("-generic" if generic else "-auto")
    src = _sources(rev, os.path.join(work, (rev or "tree").replace("/", "_")))
    out = os.path.join(work, "kernels_bench-" + tag)
    cmd = [os.environ.get("CXX", "g++"), *FLAGS, *([FORCE_GENERIC] if generic else []),
           "-I" + src, os.path.join(src, "reduce", "kernels.cc"),
           os.path.join(ROOT, "benchmarks", "kernels_bench.cc"), "-o", out]
    subprocess.run(cmd, check=True)
    return out


def run(binary: str, args) -> List[dict]:
    proc = subprocess.run([binary, str(args.payload), str(args.ranks), str(args.gb), args.dtypes,
                           args.ops], check=True, capture_output=True, text=True)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default="HEAD", help="git revision of the old kernels (HEAD)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--payload", type=int, default=1432, help="bytes per contribution (MTU 1500)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--gb", type=float, default=0.5, help="GB of contributions per measurement")
    p.add_argument("--dtypes", default="float32,float64,float16,bfloat16,int32,int64")
    p.add_argument("--ops", default="sum,min,max")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        variants: Dict[Tuple[str, bool], str] = {}
        for label, rev in (("old", args.baseline), ("new", "")):
            for generic in (False, True):
                variants[(label, generic)] = build(rev, generic, work)
        raw: List[dict] = []
        for r in range(args.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for generic in (False, True):
                for label in order:
                    for rec in run(variants[(label, generic)], args):
                        raw.append(dict(rec, version=label, round=r,
                                        path="generic" if generic else rec["simd"]))
    table = []
    keys = sorted({(x["path"], x["dtype"], x["op"]) for x in raw})
    print(f"{'path':10} {'dtype':9} {'op':4} {'old CPU-s/GB':>22} {'new CPU-s/GB':>22} {'new/old':>8}")
    for path, dtype, op in keys:
        row = {"path": path, "dtype": dtype, "op": op}
        for label in ("old", "new"):
            vals = [x["cpu_s_per_gb"] for x in raw
                    if (x["path"], x["dtype"], x["op"], x["version"]) == (path, dtype, op, label)]
            row[label] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
                          "n": len(vals)}
        pairs = []
        for r in range(args.rounds):
            got = {x["version"]: x["cpu_s_per_gb"] for x in raw
                   if (x["path"], x["dtype"], x["op"], x["round"]) == (path, dtype, op, r)}
            if len(got) == 2:
                pairs.append(got["new"] / got["old"])
        row["ratio"] = {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)}
        table.append(row)
        o, n, q = row["old"], row["new"], row["ratio"]
        print(f"{path:10} {dtype:9} {op:4} {o['median']:8.4f} ({o['min']:.4f}-{o['max']:.4f}) "
              f"{n['median']:8.4f} ({n['min']:.4f}-{n['max']:.4f}) {q['median']:8.3f}")
    if args.json:
        meta = {"when": utc_now(), "command": command_line(), "machine": machine_description(),
                "load": os.getloadavg(), "baseline": args.baseline, "payload": args.payload,
                "ranks": args.ranks, "gb": args.gb, "rounds": args.rounds, "summary": table}
        write_json(args.json, meta, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
