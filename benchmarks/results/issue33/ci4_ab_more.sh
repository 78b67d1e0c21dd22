#!/bin/bash
# pairs 4 and 5 of each file (the first of a pair alternated as in ab.sh)
for i in 4 5; do
 for f in elastic bench; do
  [ $f = elastic ] && t=tests/parallel/test_elastic_examples.py || t=tests/parallel/test_benchmarks.py
  if [ $((i % 2)) = 1 ]; then arms="base ci4"; else arms="ci4 base"; fi
  for arm in $arms; do
    tree=/work/wt/ci4; [ $arm = base ] && tree=/work/wt/ci4_base
    l0=$(cut -d' ' -f1 /proc/loadavg); s=$(date +%s.%N); st=$(date -u +%H:%M:%S)
    log=/tmp/ci4/ab_last_${arm}.log
    (cd $tree && python3 -m pytest -q -p no:cacheprovider $t > $log 2>&1)
    rc=$?; e=$(date +%s.%N); l1=$(cut -d' ' -f1 /proc/loadavg)
    last=$(tail -1 $log); ps=$(echo "$last" | grep -oE 'in [0-9.]+s' | grep -oE '[0-9.]+')
    [ $rc = 0 ] || cp $log /tmp/ci4/ab_fail_${arm}_$(date +%H%M%S).log
    printf "%d %s %s %s %s %.2f %s rc=%s %s\n" $i $arm $st $l0 $l1 $(echo "$e - $s" | bc) "$ps" $rc "$last" >> /tmp/ci4/ab_$f.txt
  done
 done
done
