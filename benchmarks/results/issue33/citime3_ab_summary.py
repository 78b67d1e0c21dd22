"""Summary of citime3_ab.sh's records: per file, median (min-max) of base and branch
seconds (pytest's own "in N s", and the whole process's wall), the per-pair
difference and the load range."""
import re
import statistics
import sys
from collections import defaultdict

runs = defaultdict(lambda: defaultdict(dict))
loads = defaultdict(list)
for line in open(sys.argv[1]):
    m = re.search(r"pair=(\d+) arm=(\w+) file=(\S+) wall=([\d.]+) load=([\d.]+)-([\d.]+) result=\"(.*)\"", line)
    if not m:
        continue
    pair, arm, f, wall, l0, l1, res = m.groups()
    inner = re.search(r" in ([\d.]+)s", res)
    runs[f][int(pair)][arm] = (float(inner.group(1)) if inner else float("nan"), res, float(wall))
    loads[f] += [float(l0), float(l1)]


def fmt(xs):
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


print("| file | pairs | load | main s (pytest) | branch s (pytest) | branch - main per pair, s | "
      "same, whole process wall |")
print("|---|---:|---|---:|---:|---:|---:|")
for f, pairs in runs.items():
    full = [p for p in pairs.values() if "base" in p and "branch" in p]
    b = [p["base"][0] for p in full]
    c = [p["branch"][0] for p in full]
    d = [y - x for x, y in zip(b, c)]
    dw = [p["branch"][2] - p["base"][2] for p in full]
    bad = [p for p in full for a in p.values() if "failed" in a[1] or "error" in a[1]]
    print(f"| `{f}` | {len(full)} | {min(loads[f]):.1f}-{max(loads[f]):.1f} | {fmt(b)} | {fmt(c)} | "
          f"{fmt(d)} | {fmt(dw)} |" + (f" FAILURES {len(bad)}" if bad else ""))
