#!/bin/bash
# usage: prof.sh TREE TAG [ITERS]  -- one 40G MTU 1500 N=4 64 MiB testbed run from TREE,
# perf record -g on rank 0's process for 5 s in its middle, /proc stat utime/stime of every rank.
TREE=$1; TAG=$2; ITERS=${3:-40}
OUT=/tmp/rank58/$TAG; mkdir -p $OUT
cd $TREE
uptime > $OUT/load.txt
env -u PYTHONPATH python3 benchmarks/allreduce.py --testbed --rate 40gbit --mtu 1500 --np 4 --impls netreduce \
  --min-size 64M --max-size 64M --min-iters $ITERS --max-iters $ITERS --testbed-name rk --subnet 10.99.58.0/24 \
  --json $OUT/run.json > $OUT/run.log 2>&1 &
BG=$!
# wait for the ranks of THIS tree
for i in $(seq 1 120); do
  PIDS=$(pgrep -f "$TREE/benchmarks/allreduce_rank.py" | while read p; do [ "$(readlink /proc/$p/exe)" != "" ] && grep -q python /proc/$p/comm && echo $p; done)
  [ $(echo $PIDS | wc -w) -ge 4 ] && break; sleep 0.5
done
echo "ranks: $PIDS" > $OUT/pids.txt
sleep ${DELAY:-14}
P0=$(echo $PIDS | awk '{print $1}')
for p in $PIDS; do echo "$p $(awk '{print $14, $15}' /proc/$p/stat)"; done > $OUT/stat0.txt
perf record -e cpu-clock -F 4000 -g -p $P0 -o $OUT/perf.data -- sleep 5 2>>$OUT/perf.err
for p in $PIDS; do echo "$p $(awk '{print $14, $15}' /proc/$p/stat)"; done > $OUT/stat1.txt
wait $BG
uptime >> $OUT/load.txt
perf report -i $OUT/perf.data --no-children --sort dso,sym --stdio 2>/dev/null | grep -v "^$" | head -120 > $OUT/report.txt
tail -5 $OUT/run.log
