#!/usr/bin/env bash
# usage: lazy_ab.sh PAIRS OUT FILE...  -- each test file alone, base tree and this tree
# alternated (the first of each pair alternated), pytest's "in N s", the whole process's
# wall, the 1-min load before-after, and how many Python processes (daemons) the run
# started (a sitecustomize on PYTHONPATH that logs each start: /tmp/lz/site, both arms).
set -u
pairs=$1; out=$2; shift 2
BASE=/work/wt/lazy_base; BRANCH=/work/wt/lazy
for f in "$@"; do
  for i in $(seq 1 "$pairs"); do
    if [ $((i % 2)) -eq 1 ]; then order="base branch"; else order="branch base"; fi
    for arm in $order; do
      [ "$arm" = base ] && tree=$BASE || tree=$BRANCH
      log=/tmp/lz/ab_proc_$$.log; rm -f "$log"
      l0=$(cut -d' ' -f1 /proc/loadavg); s=$(date +%s.%N)
      res=$(cd "$tree" && LZ_PROCLOG=$log PYTHONPATH=/tmp/lz/site timeout 900 python3 -m pytest -q -p no:cacheprovider "$f" 2>&1 | tail -1)
      e=$(date +%s.%N); l1=$(cut -d' ' -f1 /proc/loadavg)
      n=$(grep -c '^S' "$log" 2>/dev/null || echo 0); d=$(grep '^S' "$log" 2>/dev/null | grep -c "'netreduce.switch'")
      printf '%s pair=%d arm=%s wall=%.1f load=%s-%s starts=%s daemons=%s | %s\n' "$f" "$i" "$arm" \
        "$(echo "$e - $s" | bc)" "$l0" "$l1" "$n" "$d" "$res" | tee -a "$out"
    done
  done
done
