#!/usr/bin/env bash
# lead's quiet check, 12-07 (session 56): base = /work/wt/base56 (c2e2115, stop 55's end), main = /work/main (f758ccf)
LOG=/work/team/lead56_quiet.log
{
date -u; uptime
for i in 1 2 3; do
  (cd /work/wt/base56 && PYTHONPATH=/work/wt/base56 python3 benchmarks/issue33.py latency --runs 5 --out /work/team/lead56_latency_base_$i.json) | tail -4; uptime
  (cd /work/main && PYTHONPATH=/work/main python3 benchmarks/issue33.py latency --runs 5 --out /work/team/lead56_latency_main_$i.json) | tail -4; uptime
done
date -u
} > $LOG 2>&1
echo done >> $LOG
