#!/bin/bash
# Paired A/B of pytest wall time, the order alternated per pair (AB, BA, AB, ...):
# A = main's copy of a test file saved beside it under another test_* name
# (`git show main:tests/x/test_y.py > tests/x/test_zzbase_y.py`), B = the changed file.
# Appends "file pair order seconds load=1m,5m,15m result" per run. From the repository
# root, its venv active:
#   bash benchmarks/results/issue33/citrim_pytest_abba.sh N OUT A B [pytest args...]
n=$1; out=$2; a=$3; b=$4; shift 4; extra=("$@")
one() {
  local f=$1 i=$2 o=$3 l s e r
  l=$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' ,)
  s=$(date +%s.%N)
  r=$(python -m pytest -q -p no:cacheprovider "$f" "${extra[@]}" 2>&1 | tail -1)
  e=$(date +%s.%N)
  printf "%s %d %s %.2f load=%s %s\n" "$(basename "$f")" "$i" "$o" "$(echo "$e - $s" | bc)" "$l" "$r" | tee -a "$out"
}
for i in $(seq "$n"); do
  if [ $((i % 2)) = 1 ]; then one "$a" "$i" AB; one "$b" "$i" AB
  else one "$b" "$i" BA; one "$a" "$i" BA; fi
done
