#!/bin/bash
# bye: a rank's threads' wake-ups and CPU (schedstat) in a 4 KiB steady loop, the second
# after it and idle, main (bye_base) against bye, alternated, N=4 and N=2.
OUT=/work/wt/bye/benchmarks/results/issue33
LOG=$OUT/bye_wakes.log
for i in $(seq 1 ${1:-5}); do
  if [ $((i % 2)) -eq 1 ]; then order="bye_base bye"; else order="bye bye_base"; fi
  for n in 4 2; do
    for t in $order; do
      echo "pair $i np $n $t $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $LOG
      (cd /work/wt/$t && PYTHONPATH=/work/wt/$t timeout 300 python3 -m netreduce.launcher -np $n -- \
         python3 $OUT/bye_wakes.py 3000 5 2>&1 | grep '"rank"' | sed "s/^/$t np$n pair$i /" >> $LOG)
    done
  done
done
echo DONE >> $LOG
