#!/bin/bash
# ab.sh N OUT TEST...: N pairs, base (/work/wt/ci4_base) and branch (/work/wt/ci4) alternated,
# the first of each pair alternated; one line per run: pair arm start load0 load1 wall pytest_s result
N=$1; OUT=$2; shift 2
for i in $(seq 1 $N); do
  if [ $((i % 2)) = 1 ]; then arms="base ci4"; else arms="ci4 base"; fi
  for arm in $arms; do
    tree=/work/wt/ci4; [ $arm = base ] && tree=/work/wt/ci4_base
    l0=$(cut -d' ' -f1 /proc/loadavg); s=$(date +%s.%N); st=$(date -u +%H:%M:%S)
    log=/tmp/ci4/ab_last_${arm}.log
    (cd $tree && python3 -m pytest -q -p no:cacheprovider "$@" > $log 2>&1)
    rc=$?; e=$(date +%s.%N); l1=$(cut -d' ' -f1 /proc/loadavg)
    last=$(tail -1 $log)
    ps=$(echo "$last" | grep -oE 'in [0-9.]+s' | grep -oE '[0-9.]+')
    [ $rc = 0 ] || cp $log /tmp/ci4/ab_fail_${arm}_$(date +%H%M%S).log
    printf "%d %s %s %s %s %.2f %s rc=%s %s\n" $i $arm $st $l0 $l1 $(echo "$e - $s" | bc) "$ps" $rc "$last" >> $OUT
  done
done
