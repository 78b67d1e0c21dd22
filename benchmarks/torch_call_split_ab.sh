#!/bin/bash
# Issue 33, netreduce.torch's per-call cost: rank 0's split of a steady 4 KiB step
# (benchmarks/latency_split.py: Python before the engine / the engine / Python after,
# and rank 0's CPU per step), alternated in every round: hvd.allreduce on the baseline
# checkout, hvd.allreduce on this one, nr.allreduce (the numpy API) on this one; N=2, 4.
#
#   benchmarks/torch_call_split_ab.sh BASE_PYTHON BASE_CHECKOUT OUT.jsonl [ROUNDS]
#
# BASE_PYTHON: a venv's python with BASE_CHECKOUT installed editable (netreduce.torch
# maps to its frameworks/torch); this checkout runs under the python on PATH.
# Summary: python3 benchmarks/torch_call_split_ab.py OUT.jsonl
set -e
base_py=$1; base=$2; out=$3; rounds=${4:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
split=$here/benchmarks/latency_split.py
for i in $(seq "$rounds"); do for n in 2 4; do
  echo "{\"round\": $i, \"np\": $n, \"uptime\": \"$(uptime | sed 's/.*load/load/')\"}" >> "$out"
  "$base_py" "$split" --code "$base" --np "$n" --api torch --iters 3000 --json "$out" >/dev/null
  python3 "$split" --code "$here" --np "$n" --api torch --iters 3000 --json "$out" >/dev/null
  python3 "$split" --code "$here" --np "$n" --api numpy --iters 3000 --json "$out" >/dev/null
done; done
