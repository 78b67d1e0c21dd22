"""citime2, 12-07: the paired runs of citime2_ab.sh, summarised: per run the whole
pytest wall, the four tests whose peers' answers a fresh machine computes (fsdp x3,
the Horovod reducescatter comparison) and the rest (the subset's other 82 - 4 tests).
    python3 benchmarks/results/issue33/citime2_ab_summary.py citime2_prebuild_ab.txt"""
import re
import statistics
import sys

log = sys.argv[1]
runs = [ln for ln in open(log) if ln.startswith(("base ", "branch "))]
dur = {}
cur = None
for ln in open(log + ".durations"):
    if ln.startswith("== "):
        cur = ln.split()[2]
        dur[cur] = 0.0
    elif "test_torch_fsdp" in ln or "match_horovod" in ln:
        dur[cur] += float(ln.split("s ")[0])
rows = []
for ln in runs:
    label, at = ln.split()[:2]
    wall = float(re.search(r"wall=([\d.]+)", ln).group(1))
    load = re.search(r"load=(\S+)", ln).group(1)
    rows.append((label, at, wall, dur.get(at, float("nan")), load))
for r in rows:
    print(f"{r[0]:7s} {r[1]} wall {r[2]:7.1f}  peers' 4 tests {r[3]:6.1f}  rest {r[2] - r[3]:6.1f}  load {r[4]}")

# pairs: consecutive base/branch runs after the last "# from here" line of the log
tail = open(log).read().rsplit("# from here", 1)[-1]
last = [r for r in rows if f"{r[0]} {r[1]}" in tail]
pairs = [last[i:i + 2] for i in range(0, len(last) - 1, 2)]
print("\npair | load | base s (4 tests) | branch s (4 tests) | branch / base (4 tests)")
ratios, ratios4, b_w, n_w, b_4, n_4 = [], [], [], [], [], []
for k, pr in enumerate(pairs, 1):
    base = next(r for r in pr if r[0] == "base")
    br = next(r for r in pr if r[0] == "branch")
    ratios.append(br[2] / base[2])
    ratios4.append(br[3] / base[3])
    b_w.append(base[2])
    n_w.append(br[2])
    b_4.append(base[3])
    n_4.append(br[3])
    print(f"{k} | {pr[0][4]}, {pr[1][4]} | {base[2]:.1f} ({base[3]:.1f}) | {br[2]:.1f} ({br[3]:.1f}) | "
          f"{ratios[-1]:.2f} ({ratios4[-1]:.2f})")


def med(x):
    return f"{statistics.median(x):.2f} ({min(x):.2f}-{max(x):.2f})"


if pairs:
    print(f"median | | {med(b_w)} ({med(b_4)}) | {med(n_w)} ({med(n_4)}) | {med(ratios)} ({med(ratios4)})")
