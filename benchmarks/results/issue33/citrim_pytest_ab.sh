#!/bin/bash
# Paired A/B of one test file's pytest wall time: main's copy (saved under another test_*
# name beside it, e.g. `git show main:tests/parallel/test_x.py > tests/parallel/test_zzbase_x.py`)
# against the changed file, alternated N times; appends "file run seconds load=... result".
# Run from the repository root with its venv active:
#   bash benchmarks/results/issue33/citrim_pytest_ab.sh 5 OUT tests/parallel/test_zzbase_x.py tests/parallel/test_x.py
n=$1; out=$2; a=$3; b=$4; shift 4
for i in $(seq "$n"); do
  for f in "$a" "$b"; do
    l=$(cut -d' ' -f1-3 /proc/loadavg)
    s=$(date +%s.%N)
    r=$(python -m pytest -q -p no:cacheprovider "$f" "$@" 2>&1 | tail -1)
    e=$(date +%s.%N)
    printf "%s %d %.2f load=%s %s\n" "$(basename "$f")" "$i" "$(echo "$e - $s" | bc)" "$l" "$r" | tee -a "$out"
  done
done
