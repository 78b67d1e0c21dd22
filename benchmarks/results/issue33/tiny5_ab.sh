#!/usr/bin/env bash
# tiny5 (12-07): the paired A/B of BENCHMARKS.md "4 KiB public-API all-reduce at N=4 ... (tiny5)", as it ran.
# base = main 581f963 in /work/wt/tiny5_base, branch = /work/wt/tiny5; every pair alternates.
set -u
R=/work/wt/tiny5/benchmarks/results/issue33
cd /work/wt/tiny5
ld() { cut -d' ' -f1 /proc/loadavg; }
echo "== probe N=4 (per rank per call; tiny4_probe.py), 5 rounds"
for r in 1 2 3 4 5; do for t in tiny5_base tiny5; do
  echo "-- round $r $t load $(ld)"; ITERS=3000 python3 $R/tiny4_probe.py /work/wt/$t 4 api 2>&1; done; done
echo "== probe N=2, 3 rounds"
for r in 1 2 3; do for t in tiny5_base tiny5; do
  echo "-- round $r $t load $(ld)"; ITERS=3000 python3 $R/tiny4_probe.py /work/wt/$t 2 api 2>&1; done; done
for run in b c; do for n in 4 2; do
  echo "== control_plane step N=$n run $run load $(ld)"
  python3 benchmarks/control_plane.py step --np $n --repeat 5 --variants before,agreement,dataplane --cycles 1 \
    --algorithms auto --before /work/wt/tiny5_base --json $R/tiny5_ab_n${n}_${run}.json 2>&1 | tail -12
  echo "load after $(ld)"
done; done
echo "== control_plane step N=2 run a load $(ld)"
python3 benchmarks/control_plane.py step --np 2 --repeat 5 --variants before,agreement,dataplane --cycles 1 \
  --algorithms auto --before /work/wt/tiny5_base --json $R/tiny5_ab_n2_a.json 2>&1 | tail -12
for k in 1 2 3; do for t in tiny5_base tiny5; do
  echo "== issue33 latency $t $k load $(ld)"
  (cd /work/wt/$t && python3 benchmarks/issue33.py latency --runs 5 --out $R/tiny5_latency_${t}_$k.json 2>&1 | tail -4)
  echo "load after $(ld)"
done; done
echo DONE
