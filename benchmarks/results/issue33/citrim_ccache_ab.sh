#!/bin/bash
# paired A/B: pip install -e . (no deps) with install.sh's ccache settings, with and without CCACHE_IGNOREOPTIONS='-I/tmp/tmp*'
out=$1; n=${2:-5}
cd /work/wt/citrim; . ${VENV:-/tmp/citrim-venvA}/bin/activate
export CC="ccache gcc" CXX="ccache g++" CCACHE_BASEDIR="$PWD"
for i in $(seq $n); do for mode in base ignore; do
  unset CCACHE_IGNOREOPTIONS; [ $mode = ignore ] && export CCACHE_IGNOREOPTIONS='-I/tmp/tmp*'
  l=$(cut -d' ' -f1-3 /proc/loadavg); rm -f /tmp/citrim-ccl.log
  /usr/bin/time -o /tmp/citrim-cct.txt -f "wall %e cpu_user %U cpu_sys %S" env CCACHE_LOGFILE=/tmp/citrim-ccl.log pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1; t=$(tail -1 /tmp/citrim-cct.txt)
  r=$(grep -o "Result: \(direct_cache_hit\|direct_cache_miss\|preprocessed_cache_hit\|cache_miss\)" /tmp/citrim-ccl.log | sort | uniq -c | awk '{printf "%s=%s ", $3, $1}')
  echo "$mode $i $t load=$l $r" >> $out
done; done
