#!/usr/bin/env bash
# usage: mypy_ab.sh PAIRS OUT PYTHON -- `python scripts/lint.py mypy` in a NEW clean clone each run:
# main's lint.py (mypy's cache in the clone: cold) against the branch's (cache under
# ~/.cache/netreduce/mypy/<key>), alternated, first of each pair alternated; PYTHON's env
set -uo pipefail
pairs=$1; out=$2; py=$3
one() {
  local arm=$1 i=$2 C=/tmp/ci7_ab/mypy_clone_$1_$2
  rm -rf "$C"; git clone -q /work/wt/ci7 "$C"
  if [ "$arm" = ci7 ]; then cp /work/wt/ci7/scripts/lint.py "$C/scripts/lint.py"; else git -C "$C" checkout -q e50beaf; fi  # main = e50beaf
  local l1; l1=$(cut -d' ' -f1 /proc/loadavg)
  ( cd "$C" && PATH="$(dirname "$py"):$PATH" /usr/bin/time -f "%e %U %S" -o /tmp/ci7_ab/mt "$py" scripts/lint.py mypy > /tmp/ci7_ab/mo 2>&1 )
  local rc=$? l2; l2=$(cut -d' ' -f1 /proc/loadavg); read -r w u s < /tmp/ci7_ab/mt
  echo "$(date -u +%H:%M:%S) $arm run $i rc $rc wall $w cpu $(echo "$u + $s" | bc) load $l1-$l2 | $(grep -E 'Success|error' /tmp/ci7_ab/mo | tail -1)" | tee -a "$out"
  rm -rf "$C"
}
for ((p = 0; p <= pairs; p++)); do
  if ((p == 0)); then one ci7 0; continue; fi   # the branch's first run fills its cache
  if ((p % 2)); then one main $p; one ci7 $p; else one ci7 $p; one main $p; fi
done
