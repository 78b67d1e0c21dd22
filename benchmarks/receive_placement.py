"""A rank's CPU to receive 64 MiB of results, by how the payloads reach dst (issue 33,
"results straight into place"): the engine's batch receive (coalesced runs into
staging, then each payload copied into place; or the payloads of a run streamed into
dst as one by non-temporal stores), the same without the copy (what the copy costs),
and a direct receive (peek at a run's first header, then one recvmsg
scattering each payload straight into its place in dst), with and without the next
run's places prefetched. Modes alternate round by round in one process, so a loaded
machine weighs on all alike; medians and spreads of the receiving thread's CPU-ms per
64 MiB, and each mode's ratio to the batch receive in the same round.

    python benchmarks/receive_placement.py [--payloads 1432,8936] [--rounds 10]
        [--json benchmarks/results/issue33/receive_placement_UTC.json]

What it runs is benchmarks/receive_placement.cc (a sender thread, UDP GSO over
loopback into a UDP GRO socket); needs g++ and a kernel with UDP GRO (5.0+)."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import command_line, machine_description, utc_now, write_json  # noqa: E402

FLAGS = ["-std=c++17", "-O2", "-Wall", "-pthread"]
BASE = "staged"
MODES = 5  # receive_placement.cc kNumModes


def _spread(vals: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--payloads", default="1432,8936",
                   help="payload bytes per result, comma-separated (MTU 1500's, MTU 9000's)")
    p.add_argument("--rounds", type=int, default=10, help="rounds of every mode")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    raw: List[dict] = []
    summary: Dict[str, dict] = {}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as work:
        binary = os.path.join(work, "receive_placement")
        subprocess.run([os.environ.get("CXX", "g++"), *FLAGS,
                        os.path.join(ROOT, "benchmarks", "receive_placement.cc"), "-o", binary],
                       check=True)
        for payload in (int(x) for x in args.payloads.split(",")):
            out = subprocess.run([binary, str(payload), str(args.rounds * MODES)], check=True,
                                 capture_output=True, text=True, timeout=900).stdout
            recs = []
            for i, line in enumerate(out.splitlines()):
                mode, ms, check = line.split()
                recs.append({"payload": payload, "round": i // MODES, "mode": mode,
                             "cpu_ms_per_64mib": float(ms), "check": check})
            bad = [r for r in recs if r["check"] == "WRONG"]
            if bad:
                print(f"payload {payload}: results wrong in {bad}", file=sys.stderr)
                return 1
            raw += recs
            modes = list(dict.fromkeys(r["mode"] for r in recs))
            base = {r["round"]: r["cpu_ms_per_64mib"] for r in recs if r["mode"] == BASE}
            print(f"payload {payload} B: receiving thread's CPU-ms per 64 MiB, median (min-max); "
                  f"ratio to {BASE} in the same round")
            for mode in modes:
                mine = [r for r in recs if r["mode"] == mode]
                cpu = _spread([r["cpu_ms_per_64mib"] for r in mine])
                ratio = _spread([r["cpu_ms_per_64mib"] / base[r["round"]] for r in mine])
                summary[f"{payload} {mode}"] = {"cpu_ms_per_64mib": cpu, "ratio_to_staged": ratio}
                print(f"  {mode:14} {cpu['median']:7.2f} ({cpu['min']:.2f}-{cpu['max']:.2f})  "
                      f"x{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})")
    load = list(load0) + list(os.getloadavg())
    print(f"load {load[0]:.1f} -> {load[3]:.1f}")
    if args.json:
        meta = {"when": utc_now(), "command": command_line(), "machine": machine_description(),
                "load": load, "rounds": args.rounds, "summary": summary}
        write_json(args.json, meta, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
