#!/bin/bash
# Issue 33, netreduce-run's start: wall time of `netreduce-run -np N` running a numpy
# program that does init() and one 4-element all-reduce, on this host (no ssh), the
# baseline checkout and this one alternated in every pair; one JSON line per run.
#
#   benchmarks/launch_local_ab.sh BASE_PYTHON BASE_CHECKOUT OUT.jsonl [PAIRS] [N]
#
# BASE_PYTHON: a venv's python for BASE_CHECKOUT (built in place); this checkout runs
# under the python on PATH. Each run: PYTHONPATH and cwd at its checkout, no
# NETREDUCE_SWITCH (netreduce-run starts its aggregator).
set -e
base_py=$1; base=$2; out=$3; pairs=${4:-10}; n=${5:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
new_py=$(command -v python3)
code='import numpy as np, netreduce as nr; nr.init(); nr.allreduce(np.ones(4, np.float32), op=nr.Sum); nr.shutdown()'
for i in $(seq "$pairs"); do
  for v in base new; do
    if [ "$v" = base ]; then py=$base_py; dir=$base; else py=$new_py; dir=$here; fi
    load=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(date +%s.%N)
    rc=0; (cd "$dir" && env -u NETREDUCE_SWITCH PYTHONPATH="$dir" "$py" -m netreduce.launcher \
        -np "$n" "$py" -c "$code" >/dev/null 2>&1) || rc=$?
    t1=$(date +%s.%N)
    echo "{\"pair\": $i, \"variant\": \"$v\", \"np\": $n, \"rc\": $rc, \"wall_s\": $(echo "$t1 - $t0" | bc), \"load1\": $load}" >> "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
for n in sorted({r["np"] for r in rs}):
    b = {r["pair"]: r["wall_s"] for r in rs if r["np"] == n and r["variant"] == "base" and r["rc"] == 0}
    w = {r["pair"]: r["wall_s"] for r in rs if r["np"] == n and r["variant"] == "new" and r["rc"] == 0}
    d = [w[k] - b[k] for k in b if k in w]
    print(f"np {n}: base {st.median(b.values()):.2f} s ({min(b.values()):.2f}-{max(b.values()):.2f}), "
          f"new {st.median(w.values()):.2f} s ({min(w.values()):.2f}-{max(w.values()):.2f}); "
          f"paired new-base {st.median(d):+.2f} s ({min(d):+.2f}..{max(d):+.2f}), new faster in "
          f"{sum(x < 0 for x in d)}/{len(d)}; load {min(r['load1'] for r in rs if r['np'] == n)}-"
          f"{max(r['load1'] for r in rs if r['np'] == n)}")
PY
