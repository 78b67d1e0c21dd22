"""flake_runs.log -> runs, failures and load range per (file, code): "main" is d94b33e
(flake_base, or this branch before the file's own change), "branch" this branch with it.
Usage: python3 flake_summary.py flake_runs.log"""
import re
import sys
from collections import defaultdict

# when this branch's change to each file was in the work tree (UTC, the log's clock)
CHANGED = {"tests/unit/test_overlap_step.py": "13:02:35",
           "tests/parallel/test_dataplane.py": "13:19:18",
           "tests/parallel/test_hierarchical.py": "13:22:00",
           "tests/parallel/test_dataplane_faults.py": "13:39:00"}


def _start(end, secs):
    h, m, s = map(int, end.split(":"))
    t = h * 3600 + m * 60 + s - secs
    return f"{t // 3600:02d}:{t % 3600 // 60:02d}:{t % 60:02d}"



rows = defaultdict(lambda: [0, 0, 99.0, 0.0])
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) (\S+) (?:(\S+)@\S+ )?(\S+) .*rc=(\d+) secs=(\d+) load=([\d.]+)-([\d.]+)",
                 line)
    if not m:
        continue
    end, tag, tree, path, rc, secs, l0, l1 = m.groups()
    start = _start(end, int(secs))
    if tree == "flake_base":
        code = "main"
    else:
        code = "branch" if path in CHANGED and start > CHANGED[path] else "main"
    if tag == "F":  # that file's one test, -k test_spurious_retransmissions_are_recognised
        path += " -k spurious"
    r = rows[(path, code)]
    r[0] += 1
    r[1] += rc != "0"
    r[2] = min(r[2], float(l0), float(l1))
    r[3] = max(r[3], float(l0), float(l1))
print("| file | code | runs | failed | load (1-min, start-end of runs) |")
print("|---|---|---:|---:|---|")
for (path, code), (n, f, lo, hi) in sorted(rows.items()):
    print(f"| `{path}` | {code} | {n} | {f} | {lo:.1f}-{hi:.1f} |")
