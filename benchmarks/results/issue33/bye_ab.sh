#!/bin/bash
# bye's A/B of the executor's poll: main (bye_base) and bye, alternated ABBA,
# each tree's own issue33.py latency --runs 3; the load before and after each run.
OUT=/work/wt/bye/benchmarks/results/issue33
TAG=${TAG:-}   # a second set: TAG=q writes bye_latency_q..., bye_ab_q.log
LOG=$OUT/bye_ab${TAG:+_$TAG}.log
pairs=${1:-5}
for i in $(seq 1 $pairs); do
  if [ $((i % 2)) -eq 1 ]; then order="bye_base bye"; else order="bye bye_base"; fi
  for t in $order; do
    echo "pair $i $t start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $LOG
    (cd /work/wt/$t && PYTHONPATH=/work/wt/$t nice -n 0 python3 benchmarks/issue33.py latency --runs 3 \
       --out $OUT/bye_latency_${TAG}${t}_$i.json > $OUT/bye_latency_${TAG}${t}_$i.txt 2>&1)
    echo "pair $i $t end $(date -u +%H:%M:%S) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $LOG
  done
done
echo DONE >> $LOG
