#!/bin/bash
# usage: nap_drops.sh TREE MTU RATE ; one netreduce-only run, UDP counters of every n15 namespace sampled until teardown
TREE=$1; MTU=$2; RATE=$3
cd $TREE
python3 benchmarks/allreduce.py --np 4 --impls netreduce --min-size 64M --max-size 64M --min-iters 5 --max-iters 5 --testbed --rate $RATE --mtu $MTU --testbed-name n15 --subnet 10.99.1.0/24 --json /tmp/nap_drops_run.json >/dev/null 2>&1 &
BG=$!
declare -A last
while kill -0 $BG 2>/dev/null; do
  for ns in n15-agg n15-h0 n15-h1 n15-h2 n15-h3; do
    v=$(ip netns exec $ns awk '/^Udp:/{n++; if(n==2) print $3, $4, $6}' /proc/net/snmp 2>/dev/null)
    [ -n "$v" ] && last[$ns]="$v"
  done
  sleep 0.3
done
echo "$(basename $TREE) NoPorts InErrors RcvbufErrors: agg ${last[n15-agg]} | h0 ${last[n15-h0]} | h1 ${last[n15-h1]} | h2 ${last[n15-h2]} | h3 ${last[n15-h3]}"
python3 -c "
import json;r=[x for x in json.load(open('/tmp/nap_drops_run.json'))['records'] if x['impl']=='netreduce'][0];print(' resends/rank', round(r['retransmits_per_rank'],2), 'timeout_probes', round(r['timeout_probes_per_rank'],2), 'spurious', round(r['spurious_retransmits_per_rank'],2), 'fast', r['fast_retransmits_per_rank'], 'time', round(r['time_s']*1e3,1), 'cpu', round(r['cpu_s_per_allreduce']*1e3,1), 'busy', round(r['machine_busy'],2), 'waits', round(r['waits_per_rank']), 'naps', round(r['naps_per_rank']))"
