"""Summary of benchmarks/torch_call_split_ab.sh's record: per N and variant (base =
hvd.allreduce on the baseline, new = on this checkout, numpy = nr.allreduce), medians
over the rounds with min-max of rank 0's Python before the engine, the engine, Python
after, the step and CPU per step (µs); and the 1-minute load at the rounds' starts.

    python3 benchmarks/torch_call_split_ab.py benchmarks/results/issue33/torch_call_split_ab.jsonl
"""
import json
import statistics
import sys


def summarize(path: str) -> dict:
    loads, data, n, at = [], {}, None, 0
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "round" in r:  # then its three runs, in the script's order
                n, at = r["np"], 0
                loads.append(float(r["uptime"].split()[2].rstrip(",")))
                continue
            v = ("base", "new", "numpy")[at]
            at += 1
            d = data.setdefault(f"np{n} {v}", {})
            for k in ("before", "engine", "after"):
                d.setdefault(k, []).append(r[k]["median_us"])
            for k in ("step_median_us", "cpu_us_per_step"):
                d.setdefault(k, []).append(r[k])
    out = {k: {m: [statistics.median(v), min(v), max(v), len(v)] for m, v in d.items()}
           for k, d in sorted(data.items())}
    out["load1_at_round_starts"] = [min(loads), max(loads)]
    return out


if __name__ == "__main__":
    s = summarize(sys.argv[1])
    for k, d in s.items():
        if k.startswith("np"):
            print(f"{k:10s} " + "  ".join(f"{m} {v[0]:.1f} ({v[1]:.1f}-{v[2]:.1f})" for m, v in d.items()))
    print("load", s["load1_at_round_starts"])
