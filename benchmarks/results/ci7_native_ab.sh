#!/usr/bin/env bash
# usage: native_ab.sh PAIRS OUT  -- install.sh's native step (its ccache block and its
# `pip install --no-build-isolation -e .`, here with --no-deps) in a NEW virtualenv each run
# (python3 -m venv; pybind11, setuptools, wheel as install.sh's first step puts them),
# main's install.sh (/tmp/ci7_ab/main) against the branch's (/tmp/ci7_ab/ci7), alternated,
# the first of each pair alternated. GNU time of the step; ccache's results from its log.
set -uo pipefail
pairs=$1; out=$2
one() {  # arm i
  local arm=$1 i=$2 V=/tmp/ci7_ab/venv_${1}_$2_$(date +%s) src=/tmp/ci7_ab/$1  # a path never used before
  rm -rf "$V"; python3 -m venv "$V"
  "$V/bin/python" -m pip install -q pybind11==3.1.0 setuptools==84.2.1 wheel==0.48.0 2>/dev/null  # as install.sh's first step leaves them (torch needs setuptools>=77)
  # the fragment: from the ccache block to the pip -e line, --no-deps added
  awk '/^build_env=\(\)|^if command -v ccache/{on=1} on{print} /pip install -q --no-build-isolation -e/{if(on) exit}' \
      "$src/scripts/install.sh" | sed 's/--no-build-isolation -e/--no-build-isolation --no-deps -e/' > "$V/fragment.sh"
  rm -f "$src"/netreduce/_native*.so; rm -rf "$src"/build "$src"/*.egg-info
  local log=/tmp/ci7_ab/ccache_${arm}_$i.log; rm -f "$log"
  local l1; l1=$(cut -d' ' -f1 /proc/loadavg)
  ( cd "$src" && export CCACHE_LOGFILE="$log" && /usr/bin/time -f "%e %U %S" -o /tmp/ci7_ab/t \
      bash -c 'set -euo pipefail; py=$1; into=$($py -c "import sys; print(sys.prefix)"); extras=torch; say() { :; }; . $2' x "$V/bin/python" "$V/fragment.sh" )
  local rc=$? l2; l2=$(cut -d' ' -f1 /proc/loadavg)
  read -r w u s < /tmp/ci7_ab/t
  local res; res=$(grep -o "Result: [a-z_]*" "$log" | sort | uniq -c | awk '{printf "%s=%s ", $3, $1}')
  echo "$(date -u +%H:%M:%S) $arm run $i rc $rc wall $w cpu $(echo "$u + $s" | bc) load $l1-$l2 | $res" | tee -a "$out"
  rm -rf "$V"
}
for ((p = 1; p <= pairs; p++)); do
  if ((p % 2)); then one main $p; one ci7 $p; else one ci7 $p; one main $p; fi
done
