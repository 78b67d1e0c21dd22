#!/usr/bin/env bash
# benchmarks/results/ci6_ab.sh PAIRS OUT FILE...: base (/work/wt/ci6_base, main) and branch (/work/wt/ci6)
# alternated, the first of each pair alternated; each arm `python3 -m pytest -q FILES`
# from its own root under GNU time (pytest and its reaped children: the background runs
# tests/prebuild.py starts are its children), the 1-min load before and after.
pairs=$1 out=$2; shift 2
for i in $(seq 1 "$pairs"); do
  if [ $((i % 2)) = 1 ]; then order="base branch"; else order="branch base"; fi
  for arm in $order; do
    root=/work/wt/ci6; [ $arm = base ] && root=/work/wt/ci6_base
    l0=$(cut -d' ' -f1 /proc/loadavg)
    r=$(cd $root && /usr/bin/time -f "TIME %e s %U user %S sys" python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | grep -E "passed|failed|error|TIME" | tr '\n' ' ')
    l1=$(cut -d' ' -f1 /proc/loadavg)
    echo "pair $i $arm $(date -u +%H:%M:%S) load $l0-$l1 $r" | tee -a "$out"
  done
done
