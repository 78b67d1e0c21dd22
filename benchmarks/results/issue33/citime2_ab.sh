#!/usr/bin/env bash
# citime2, 12-07: one run of a pytest subset in TREE as a fresh machine runs it (an empty
# NETREDUCE_CACHE: no fsdp-gloo references, no Horovod answers). Pairs, base and branch
# alternated (base first in odd pairs):
#   bash THIS LABEL TREE LOG TESTS...
# Appends one line to LOG: label, UTC time, pytest's wall, rc, load before-after, summary.
set -u
label=$1 tree=$2 log=$3
shift 3
cache=$(mktemp -d /tmp/citime2/abcache.XXXXXX)
t0=$(date +%s.%N) at=$(date -u +%H:%M:%S) load0=$(cut -d' ' -f1 /proc/loadavg)
out=$(cd "$tree" && NETREDUCE_CACHE=$cache python3 -m pytest -q -p no:cacheprovider --durations=8 "$@" 2>&1)
rc=$?
t1=$(date +%s.%N)
echo "$label $at wall=$(echo "$t1 - $t0" | bc) rc=$rc load=$load0-$(cut -d' ' -f1 /proc/loadavg) | $(echo "$out" | tail -1)" >> "$log"
echo "== $label $at" >> "$log.durations"; echo "$out" | grep -E "s (call|setup|teardown) " >> "$log.durations"
rm -rf "$cache"
exit $rc
