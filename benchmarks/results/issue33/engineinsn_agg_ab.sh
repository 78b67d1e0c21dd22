# linerate.py cost (issue33.py aggregator's recipe: --np 4 --size 64M --iters 5), MTU 1500,
# one run per tree, the order turned each pair; testbed ei2 on 10.99.2.0/24.
R=/work/wt/engineinsn/benchmarks/results/issue33
for pair in 0 1 2 3; do
  if [ $((pair % 2)) = 0 ]; then order="new base"; else order="base new"; fi
  for t in $order; do d=/work/wt/engineinsn; [ $t = base ] && d=/work/wt/engineinsn-base
    (cd $d && PYTHONPATH=$d timeout 600 python3 benchmarks/linerate.py cost --mtu 1500 --np 4 --size 64M --iters 5 --repeats 1 \
      --testbed-name ei2 --subnet 10.99.2.0/24 --json $R/engineinsn_agg_${t}_p$pair.json > /tmp/ei/agg_${t}_p$pair.log 2>&1)
    python3 -c "
import json,sys; d=json.load(open('$R/engineinsn_agg_${t}_p$pair.json')); r=(d['records'] if isinstance(d,dict) else d)
for x in r: print('$t p$pair', x.get('mtu'), 'GB/CPU-s', x.get('aggregator_GB_per_cpu_s'), 'engine CPU-s/GB', x.get('engine_cpu_s_per_GB'), 'load', x.get('loadavg',[0])[0])"
  done
done
echo ALLDONE
