#!/usr/bin/env bash
# citime3_ab.sh PAIRS OUT FILE...: pytest wall seconds of each FILE in the base tree
# (main, /work/wt/citime3_base) and this branch (/work/wt/citime3), alternated, the
# first of each pair alternated too; one line per run with the 1-min load before/after.
set -u
pairs=$1 out=$2; shift 2
for ((p = 1; p <= pairs; p++)); do
  for f in "$@"; do
    if ((p % 2)); then order="base branch"; else order="branch base"; fi
    for arm in $order; do
      if [ $arm = base ]; then tree=/work/wt/citime3_base; else tree=/work/wt/citime3; fi
      l0=$(cut -d' ' -f1 /proc/loadavg)
      s=$(date +%s.%N)
      res=$(cd $tree && python3 -m pytest -q -p no:cacheprovider "$f" 2>&1 | tail -1)
      e=$(date +%s.%N)
      l1=$(cut -d' ' -f1 /proc/loadavg)
      printf '%s pair=%d arm=%s file=%s wall=%.2f load=%s-%s result="%s"\n' \
        "$(date -u +%H:%M:%S)" $p $arm "$f" "$(echo "$e - $s" | bc)" $l0 $l1 "$res" >> "$out"
    done
  done
done
