#!/usr/bin/env bash
# The native data plane under AddressSanitizer + UndefinedBehaviorSanitizer, and a
# bounded fuzz smoke over the three harnesses (fuzz/README.md):
#   1. fuzz/build.sh: the harnesses and fuzz/dataplane_selftest.cc, clang, ASan+UBSan;
#   2. the selftest: an Aggregator and 3 Engines on loopback, every dtype x op, exact
#      results, 5 % loss (leaks, overflows, misaligned loads and races abort it);
#   3. FUZZ_SECONDS (default 10) of each fuzzer, from the committed corpora
#      (fuzz/corpus/*, copied: the run never changes the checkout).
#   bash scripts/sanitizers.sh            # CI runs it via tests/parallel/test_fuzz_smoke.py
#   FUZZ_SECONDS=60 bash scripts/sanitizers.sh
# Exits non-zero on any sanitizer report, crash or failed check. Needs clang (Debian:
# apt-get install clang libclang-rt-14-dev) and, for the control-port harness, atheris
# (pip install atheris); without atheris that harness is skipped with a message, or
# fails when REQUIRE_ATHERIS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-10}
command -v "${CXX:-clang++}" >/dev/null || { echo "sanitizers.sh: ${CXX:-clang++} not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
bash fuzz/build.sh
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
echo "== dataplane_selftest (ASan + UBSan)"
build/fuzz/dataplane_selftest
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for h in decode aggregator; do
  echo "== ${h}_fuzzer: ${secs} s"
  mkdir -p "$work/$h"
  cp fuzz/corpus/$h/* "$work/$h/" 2>/dev/null || true
  rc=0
  build/fuzz/${h}_fuzzer -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$work/" \
    "$work/$h" > "$work/$h.log" 2>&1 || rc=$?
  grep -E "stat::number_of_executed_units|ERROR|SUMMARY|runtime error|Done" "$work/$h.log" || true
  if [ "$rc" != 0 ] || ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* >/dev/null 2>&1; then
    tail -40 "$work/$h.log" >&2
    echo "sanitizers.sh: ${h}_fuzzer found a failing input:" "$work"/crash-* "$work"/leak-* "$work"/timeout-* >&2
    for f in "$work"/crash-* "$work"/leak-* "$work"/timeout-*; do [ -e "$f" ] && cp "$f" build/fuzz/; done
    exit 1
  fi
done
if python3 -c "import atheris" 2>/dev/null; then
  echo "== control_fuzzer (atheris): ${secs} s"
  mkdir -p "$work/control"
  cp fuzz/corpus/control/* "$work/control/" 2>/dev/null || true
  rc=0
  python3 fuzz/control_fuzzer.py -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$work/" "$work/control" > "$work/control.log" 2>&1 || rc=$?
  grep -E "stat::number_of_executed_units|Done" "$work/control.log" || true
  if [ "$rc" != 0 ] || ls "$work"/crash-* >/dev/null 2>&1; then
    tail -40 "$work/control.log" >&2
    cp "$work"/crash-* build/fuzz/ 2>/dev/null || true
    echo "sanitizers.sh: control_fuzzer found a failing input (copied to build/fuzz/)" >&2
    exit 1
  fi
elif [ "${REQUIRE_ATHERIS:-0}" = 1 ]; then
  echo "sanitizers.sh: atheris is not installed (pip install atheris)" >&2
  exit 1
else
  echo "== control_fuzzer skipped: atheris is not installed (pip install atheris)"
fi
echo "sanitizers.sh: all clean"
