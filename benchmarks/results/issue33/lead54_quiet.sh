#!/usr/bin/env bash
# lead's quiet run, 12-07 (session 54): base = /work/wt/split_base (main 561c20c), lead = /work/wt/lead54 (main + split + lazy + kpool)
set -x
P=/work/wt/lead54/benchmarks/results/issue33/lazy_spawn_probe.py; LOG=/work/team/lead54_quiet.log
{
date -u; uptime; git -C /work/wt/lead54 log --oneline | head -1
for i in 1 2 3 4 5; do
  (cd /work/wt/split_base && PYTHONPATH=/work/wt/split_base python3 $P 6)
  (cd /work/wt/lead54 && PYTHONPATH=/work/wt/lead54 python3 $P 6)
done
for i in 1 2 3; do
  (cd /work/wt/split_base && PYTHONPATH=/work/wt/split_base python3 benchmarks/issue33.py latency --runs 5 --out /work/team/lead54_latency_base_$i.json); uptime
  (cd /work/wt/lead54 && PYTHONPATH=/work/wt/lead54 python3 benchmarks/issue33.py latency --runs 5 --out /work/team/lead54_latency_lead_$i.json); uptime
done
date -u
cd /work/wt/lead54
PYTHONPATH=/work/wt/lead54 python3 benchmarks/overlap_frameworks.py keras --runs 5 --steps 3 --warmup 1 --modes nr-hvd,nr-hvd%inter1,compute,compute%inter1 --env-variant inter1:NRBENCH_TF_INTER_OP=1 --floor --out /work/team/lead54_keras.json
uptime; date -u
} > $LOG 2>&1
echo done >> $LOG
