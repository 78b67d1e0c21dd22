#!/bin/bash
# cpu_ab.sh OUT TEST: base, ci4, ci4, base: pytest's own + reaped children's CPU (GNU time)
OUT=$1; T=$2
for arm in base ci4 ci4 base; do
  tree=/work/wt/ci4; [ $arm = base ] && tree=/work/wt/ci4_base
  l0=$(cut -d' ' -f1 /proc/loadavg); st=$(date -u +%H:%M:%S)
  r=$(cd $tree && /usr/bin/time -f "%e %U %S" python3 -m pytest -q -p no:cacheprovider $T 2>&1 >/dev/null | tail -1)
  l1=$(cut -d' ' -f1 /proc/loadavg)
  echo "$arm $st $l0 $l1 wall/user/sys $r cpu $(echo $r | awk '{print $2+$3}')" >> $OUT
done
