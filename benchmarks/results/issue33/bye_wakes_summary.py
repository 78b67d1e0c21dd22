"""bye_wakes.log -> per tree and N: the executor's wake-ups per second and its CPU
(schedstat) per call in the steady 4 KiB loop, the rank's CPU per call, the executor's
wake-ups and the process's CPU in the second after the loop and idle; median (min-max)
over ranks x pairs, and per pair bye / main of the executor's CPU per call (mean over
ranks). Run in this folder."""
import json
import re
import statistics as st
from collections import defaultdict

vals = defaultdict(list)
pairs = defaultdict(dict)
for line in open("bye_wakes.log"):
    m = re.match(r"(\S+) np(\d) pair(\d+) \[\d+\]<stdout>:(\{.*)", line)
    if not m:
        continue
    tree, n, p, d = m.group(1), int(m.group(2)), int(m.group(3)), json.loads(m.group(4))
    s, a, i = d["steady"], d["after1s"], d["idle"]
    row = {"exec wakes/s steady": s["per_s"]["executor"],
           "exec us/call": s["run_us"]["executor"] / 3000,
           "rank cpu us/call": s["per_call_us_cpu"],
           "main us/call": s["run_us"]["main"] / 3000,
           "exec wakes/s after": a["per_s"]["executor"],
           "cpu ms in the 1 s after": a["cpu_s"] * 1e3,
           "exec wakes/s idle": i["per_s"]["executor"],
           "cpu ms/s idle": i["cpu_s"] * 1e3 / i["s"]}
    for k, v in row.items():
        vals[(n, tree, k)].append(v)
    pairs[(n, p)].setdefault(tree, []).append(row)

def f(v):
    return f"{st.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
keys = ["exec wakes/s steady", "exec us/call", "main us/call", "rank cpu us/call", "exec wakes/s after",
        "cpu ms in the 1 s after", "exec wakes/s idle", "cpu ms/s idle"]
for n in (4, 2):
    print(f"N={n}")
    for k in keys:
        print(f"  {k:24s} main {f(vals[(n, 'bye_base', k)])}   bye {f(vals[(n, 'bye', k)])}")
    for k in ("exec us/call", "main us/call", "rank cpu us/call"):
        r = []
        for (nn, _p), t in sorted(pairs.items()):
            if nn == n and "bye" in t and "bye_base" in t:
                r.append(st.mean(x[k] for x in t["bye"]) / st.mean(x[k] for x in t["bye_base"]))
        if r:
            print(f"  per pair bye/main {k}: {st.median(r):.3f} ({min(r):.3f}-{max(r):.3f}), "
                  f"lower in {sum(x < 1 for x in r)} of {len(r)}")
