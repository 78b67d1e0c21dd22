#!/bin/bash
# bye: N=2, 20,000 one-call 4 KiB steps per run, main (bye_base) and bye alternated ABBA:
# each thread's CPU per call from /proc/self/task/*/schedstat (bye_wakes.py).
OUT=/work/wt/bye/benchmarks/results/issue33
for n in 2 4; do
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) -eq 1 ]; then order="bye_base bye"; else order="bye bye_base"; fi
  for t in $order; do
    echo "pair $i np $n $t $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd /work/wt/$t && PYTHONPATH=/work/wt/$t timeout 300 python3 -m netreduce.launcher -np $n -- \
       python3 $OUT/bye_wakes.py 20000 1 2>&1 | grep '"rank"' | sed "s/^/$t np$n pair$i /")
  done
done
done
