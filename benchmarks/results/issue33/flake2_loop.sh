#!/bin/bash
# usage: flake2_loop.sh TAG N FILE_OR_NODEID [pytest args...]; TREE=DIR for another tree (default this one)
# One line per run in flake2_runs.log (code, rc, seconds, the 1-min load at start and end);
# every failing run's whole output kept as flake2_TAG_NAME_HHMMSS.txt with its load.
res=$(cd "$(dirname "$0")" && pwd)
tree=${TREE:-$(cd "$res/../../.." && pwd)}
cd "$tree" || exit 2
tag=$1; n=$2; f=$3; shift 3
name=$(basename "${f%%::*}" .py)
for i in $(seq 1 "$n"); do
  l0=$(cut -d' ' -f1 /proc/loadavg); t0=$(date +%s)
  python3 -m pytest -q -x -p no:cacheprovider "$f" "$@" > "/tmp/flake2_run_$tag.txt" 2>&1; rc=$?
  l1=$(cut -d' ' -f1 /proc/loadavg); t1=$(date +%s)
  busy=$(pgrep -fc 'python3 -c while 1: pass$')
  echo "$(date -u +%H:%M:%S) $tag $(basename "$tree")@$(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty) $f run=$i rc=$rc secs=$((t1-t0)) load=$l0-$l1 busy=$busy" >> "$res/flake2_runs.log"
  if [ "$rc" -ne 0 ]; then
    out=$res/flake2_${tag}_${name}_$(date -u +%H%M%S).txt
    { echo "# $tag $tree $f run=$i rc=$rc load=$l0-$l1 busy=$busy $(date -u)"; cat "/tmp/flake2_run_$tag.txt"; } > "$out"
  fi
done
