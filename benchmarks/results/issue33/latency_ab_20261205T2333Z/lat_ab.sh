#!/usr/bin/env bash
# 4 KiB public-API all-reduce: this session's start (03add4d) vs main, alternated, 3 pairs.
for i in 1 2 3; do
  for t in /work/wt/lead-base /work/main; do
    echo "== $t pair $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd $t && python3 benchmarks/issue33.py latency --runs 5 --out /tmp/lat_$(basename $t)_$i.json 2>&1 | python3 -c "
import sys,json; t=sys.stdin.read(); j=t[t.index('{'):t.rindex('}')+1]; d=json.loads(j)
print({n:{k.split()[-1]:v['median'] for k,v in x.items()} for n,x in d.items()})")
  done
done
