"""ci5_ab_summary.py RECORD: per arm pytest's "in N s" and GNU time's wall and CPU,
median (min-max), and branch - base per pair; failed runs counted."""
import re
import statistics
import sys
from collections import defaultdict

runs = defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.match(r"pair (\d+) (base|branch) \S+ load (\S+)-(\S+) (.*)", line)
    if not m:
        continue
    pair, arm, l0, l1, rest = m.groups()
    t = re.search(r"in ([\d.]+)s", rest)
    w = re.search(r"TIME ([\d.]+) s ([\d.]+) user ([\d.]+) sys", rest)
    failed = re.search(r"(\d+) failed", rest)
    runs[int(pair)][arm] = dict(pytest=float(t.group(1)) if t else None,
                                wall=float(w.group(1)), cpu=float(w.group(2)) + float(w.group(3)),
                                failed=int(failed.group(1)) if failed else 0, load=(l0, l1))


def fmt(xs):
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})" if xs else "-"


pairs = [p for p in sorted(runs) if len(runs[p]) == 2]
print(f"{len(pairs)} pairs; loads", [runs[p][a]["load"] for p in pairs for a in ("base", "branch")])
for key in ("pytest", "wall", "cpu"):
    base = [runs[p]["base"][key] for p in pairs]
    br = [runs[p]["branch"][key] for p in pairs]
    d = [b - a for a, b in zip(base, br) if a is not None and b is not None]
    print(f"{key}: base {fmt(base)}  branch {fmt(br)}  branch-base {fmt(d)}")
print("failed runs: base", sum(runs[p]["base"]["failed"] > 0 for p in pairs),
      "branch", sum(runs[p]["branch"]["failed"] > 0 for p in pairs))
