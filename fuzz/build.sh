#!/usr/bin/env bash
# Builds the fuzz harnesses and the sanitizer data-plane test into build/fuzz/ with
# clang (Debian: apt-get install clang; libFuzzer ships with clang's compiler-rt).
#   fuzz/build.sh            decode_fuzzer, aggregator_fuzzer (libFuzzer + ASan + UBSan)
#                            and dataplane_selftest (ASan + UBSan)
# Override the compiler with CXX=clang++-NN, the parallelism with JOBS=N (all cores).
#
# Every source is compiled once, to an object in build/fuzz/obj, all at once
# (JOBS), with libFuzzer's coverage instrumentation (-fsanitize=fuzzer-no-link);
# the three programs link from those objects (the selftest without libFuzzer's
# main: the sanitizer runtime has the coverage hooks' defaults). An object is
# rebuilt when its source, any native or fuzz header, or this script is newer.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-clang++}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
OUT=build/fuzz
OBJ="$OUT/obj"
mkdir -p "$OUT" "$OBJ"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
FLAGS="-std=c++17 -g -O1 -Inative -fwrapv $SAN -fsanitize=fuzzer-no-link"
# every aggregator and engine source, so a new file there cannot leave these unlinked
AGG_SRC="$(ls native/aggregator/*.cc) native/wire/roce.cc native/reduce/kernels.cc
         $(ls native/transport/udp/*.cc) native/transport/make_transport.cc"
ENGINE_SRC="$(ls native/engine/*.cc)"
HARNESS_SRC="fuzz/decode_fuzzer.cc fuzz/aggregator_fuzzer.cc fuzz/dataplane_selftest.cc"
# clang < 15 lacks __builtin_cpu_supports("f16c"): a shim for kernels.cc only.
SHIM=""
if ! echo 'int main(){return __builtin_cpu_supports("f16c");}' | $CXX -x c++ -o /dev/null - 2>/dev/null; then
  SHIM="-include fuzz/clang_cpu_shim.h"
fi
obj_of() { echo "$OBJ/$(echo "$1" | tr / _ | sed 's/\.cc$/.o/')"; }
export CXX FLAGS SHIM OBJ
export -f obj_of
stale=()
for src in $AGG_SRC $ENGINE_SRC $HARNESS_SRC; do
  o=$(obj_of "$src")
  if [ ! "$o" -nt "$src" ] || [ ! "$o" -nt fuzz/build.sh ] || \
     [ -n "$(find native fuzz -name '*.h' -newer "$o" | head -1)" ]; then
    stale+=("$src")
  fi
done
if [ ${#stale[@]} -gt 0 ]; then
  echo "compiling ${#stale[@]} sources with $JOBS jobs" >&2
  # shellcheck disable=SC2016
  printf '%s\n' "${stale[@]}" | xargs -P "$JOBS" -I{} bash -c '
    src={}; o=$(obj_of "$src")
    extra=""; [ "$src" = native/reduce/kernels.cc ] && extra="$SHIM"
    # shellcheck disable=SC2086
    $CXX $FLAGS $extra -c "$src" -o "$o.tmp" && mv "$o.tmp" "$o"'
fi
objs() { for s in "$@"; do obj_of "$s"; done; }
link() {  # name, extra flags, sources...
  local name=$1 extra=$2; shift 2
  local os; os=$(objs "$@")
  # shellcheck disable=SC2086
  if [ -e "$OUT/$name" ] && [ -z "$(find $os -newer "$OUT/$name" | head -1)" ]; then
    return  # up to date
  fi
  echo "linking $OUT/$name" >&2
  # shellcheck disable=SC2086
  $CXX $FLAGS $extra -o "$OUT/$name" $os -lz -lpthread
}
link decode_fuzzer "-fsanitize=fuzzer" fuzz/decode_fuzzer.cc native/wire/roce.cc
# shellcheck disable=SC2086
link aggregator_fuzzer "-fsanitize=fuzzer" fuzz/aggregator_fuzzer.cc $AGG_SRC
# shellcheck disable=SC2086
link dataplane_selftest "" fuzz/dataplane_selftest.cc $AGG_SRC $ENGINE_SRC
