#!/usr/bin/env bash
# prime the branch's copy of pybind11's headers and its ccache entries once (a first run
# on a machine misses as main does), then 3 pairs
. /dev/null
source <(sed -n '/^one() {/,/^}/p' /tmp/ci7_tools/native_ab.sh)
out=/tmp/ci7_ab/native_ab.txt
echo "# native step A/B, $(date -u +%FT%TZ); columns: arm, run, rc, wall s, CPU s (user+sys, with children), 1-min load before-after, ccache results" >> $out
one ci7 0
/tmp/ci7_tools/native_ab.sh 2 $out
