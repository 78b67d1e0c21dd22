#!/bin/bash
# usage: flake_loop.sh TAG N FILE [pytest args...]; TREE=/work/wt/flake_base for "before"
tree=${TREE:-/work/wt/flake}
cd $tree
tag=$1; n=$2; f=$3; shift 3
res=/work/wt/flake/benchmarks/results/issue33
for i in $(seq 1 $n); do
  l0=$(cut -d' ' -f1 /proc/loadavg); t0=$(date +%s)
  python3 -m pytest -q -x -p no:cacheprovider "$f" "$@" > /tmp/flake_run_$tag.txt 2>&1; rc=$?
  l1=$(cut -d' ' -f1 /proc/loadavg); t1=$(date +%s)
  echo "$(date -u +%H:%M:%S) $tag $(basename $tree)@$(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty) $f run=$i rc=$rc secs=$((t1-t0)) load=$l0-$l1" >> $res/flake_runs.log
  if [ $rc -ne 0 ]; then
    out=$res/flake_${tag}_$(basename $f .py)_$(date -u +%H%M%S).txt
    { echo "# $tag $tree $f run=$i rc=$rc load=$l0-$l1 $(date -u)"; cat /tmp/flake_run_$tag.txt; } > $out
  fi
done
