#!/bin/bash
# 4 KiB torch_small_allreduce.py on loopback, N=2, base and new alternated, 5 pairs.
PY=/work/venvs/ranknap/bin/python
for r in 0 1 2 3 4; do
  if [ $((r % 2)) -eq 0 ]; then order="base new"; else order="new base"; fi
  for t in $order; do
    if [ $t = base ]; then tree=/work/wt/ranknap-base; else tree=/work/wt/ranknap; fi
    out=$(cd $tree && PYTHONPATH=$tree timeout 300 $PY -c 'import sys; from netreduce.launcher import main; sys.exit(main())' -np 2 $PY benchmarks/torch_small_allreduce.py --iters 1000 --warmup 200 --repeat 3 2>/dev/null | grep ms_per_call)
    echo "{\"round\": $r, \"tree\": \"$t\", \"load\": $(cut -d' ' -f1 /proc/loadavg), \"result\": $out}"
  done
done
