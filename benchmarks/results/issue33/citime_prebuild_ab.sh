#!/usr/bin/env bash
# citime, 12-06: one run of a pytest subset as a fresh machine runs it (empty build
# caches: NETREDUCE_CACHE for fuzz/build.sh, NETREDUCE_TF_OP_CACHE), with the background
# builds of tests/prebuild.py on or off. Pairs, the arms alternated (on off on off ...):
#   for i in 1 2 3 4 5; do bash THIS on LOG TESTS...; bash THIS off LOG TESTS...; done
# Each run appends one line to LOG: arm, UTC time, pytest's wall, its summary, load.
set -u
arm=$1 log=$2
shift 2
cache=$(mktemp -d /tmp/citime-cache.XXXXXX) tfops=$(mktemp -d /tmp/citime-tfops.XXXXXX)
[ "$arm" = off ] && export NETREDUCE_TEST_PREBUILD=0
t0=$(date +%s.%N) at=$(date -u +%H:%M:%S) load0=$(cut -d' ' -f1 /proc/loadavg)
out=$(NETREDUCE_CACHE=$cache NETREDUCE_TF_OP_CACHE=$tfops python3 -m pytest -q -p no:cacheprovider "$@" 2>&1)
rc=$?
t1=$(date +%s.%N)
echo "$arm $at wall=$(echo "$t1 - $t0" | bc) rc=$rc load=$load0-$(cut -d' ' -f1 /proc/loadavg) | $(echo "$out" | tail -1)" >> "$log"
rm -rf "$cache" "$tfops"
exit $rc
