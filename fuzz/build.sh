#!/usr/bin/env bash
# Builds the fuzz harnesses and the sanitizer data-plane test into build/fuzz/ with
# clang (Debian: apt-get install clang; libFuzzer ships with clang's compiler-rt).
#   fuzz/build.sh            decode_fuzzer, aggregator_fuzzer (libFuzzer + ASan + UBSan)
#                            and dataplane_selftest (ASan + UBSan)
# Override the compiler with CXX=clang++-NN, the parallelism with JOBS=N (all cores).
#
# Every source is compiled once, all at once (JOBS), with libFuzzer's coverage
# instrumentation (-fsanitize=fuzzer-no-link); the three programs link from those
# objects (the selftest without libFuzzer's main: the sanitizer runtime has the
# coverage hooks' defaults).
#
# Objects and programs are kept by content under NETREDUCE_CACHE (~/.cache/netreduce)
# /fuzz: an object's key is its source, the headers it includes, this script, the flags
# and the compiler's version; a program's key is its objects'. A fresh clone (CI's) of
# sources built before compiles nothing (the build is ~30 s of 2 cores); a changed
# source or header compiles the sources it changes. Least recently used entries
# past FUZZ_CACHE_MB (default 1024) are deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-clang++}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
OUT=build/fuzz
CACHE=${NETREDUCE_CACHE:-$HOME/.cache/netreduce}/fuzz
mkdir -p "$OUT" "$CACHE"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
FLAGS="-std=c++17 -g -O1 -Inative -fwrapv $SAN -fsanitize=fuzzer-no-link"
# Debug info names sources relative to the checkout, so an object does not depend on
# where the clone is (not part of the key, for the same reason).
MAP="-fdebug-prefix-map=$PWD=."
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
sha() { sha256sum | cut -c1-40; }
toolchain=$({ $CXX --version; echo "$FLAGS | $SHIM"; cat fuzz/build.sh fuzz/clang_cpu_shim.h; } | sha)
# Each source's own headers (the compiler's -MM list, one run for all, ~2 s; kept, keyed
# by every native and fuzz file, for the next build of the same tree): a header change
# recompiles the sources that include it, not every source.
deps="$CACHE/deps-$({ echo "$toolchain"; find native fuzz -type f \( -name '*.h' -o -name '*.cc' \) -print0 |
                     sort -z | xargs -0 sha256sum; } | sha).txt"
if [ ! -e "$deps" ]; then
  # shellcheck disable=SC2086
  $CXX $FLAGS -MM $AGG_SRC $ENGINE_SRC $HARNESS_SRC |
    sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | sed 's/^[^:]*: *//' | tr -s ' ' > "$deps.$$.tmp"
  mv "$deps.$$.tmp" "$deps"
fi
touch "$deps"
declare -A headers
while read -r src hs; do
  headers[$src]=$hs
done < "$deps"
declare -A obj
todo=()
for src in $AGG_SRC $ENGINE_SRC $HARNESS_SRC; do
  [ -n "${headers[$src]+set}" ] || { echo "fuzz/build.sh: no header list for $src" >&2; exit 1; }
  # shellcheck disable=SC2086
  o="$CACHE/$({ echo "$toolchain $src ${headers[$src]}"; cat "$src" ${headers[$src]}; } | sha).o"
  obj[$src]=$o
  if [ -e "$o" ]; then touch "$o"; else todo+=("$src $o"); fi
done
if [ ${#todo[@]} -gt 0 ]; then
  echo "compiling ${#todo[@]} sources with $JOBS jobs" >&2
  export CXX FLAGS MAP SHIM
  # shellcheck disable=SC2016
  printf '%s\n' "${todo[@]}" | xargs -P "$JOBS" -L 1 bash -c '
    src=$0 o=$1 extra=""
    [ "$src" = native/reduce/kernels.cc ] && extra="$SHIM"
    # shellcheck disable=SC2086
    $CXX $FLAGS $MAP $extra -c "$src" -o "$o.$$.tmp" && mv "$o.$$.tmp" "$o"'
fi
link() {  # name, extra flags, sources...
  local name=$1 extra=$2 s os=()
  shift 2
  for s in "$@"; do os+=("${obj[$s]}"); done
  local bin
  bin="$CACHE/$name-$(echo "$toolchain $extra ${os[*]}" | sha)"
  if [ -e "$bin" ]; then
    touch "$bin"
  else
    echo "linking $OUT/$name" >&2
    # shellcheck disable=SC2086
    $CXX $FLAGS $MAP $extra -o "$bin.$$.tmp" "${os[@]}" -lz -lpthread && mv "$bin.$$.tmp" "$bin"
  fi
  cp -f "$bin" "$OUT/$name.tmp" && mv -f "$OUT/$name.tmp" "$OUT/$name"
}
link decode_fuzzer "-fsanitize=fuzzer" fuzz/decode_fuzzer.cc native/wire/roce.cc
# shellcheck disable=SC2086
link aggregator_fuzzer "-fsanitize=fuzzer" fuzz/aggregator_fuzzer.cc $AGG_SRC
# shellcheck disable=SC2086
link dataplane_selftest "" fuzz/dataplane_selftest.cc $AGG_SRC $ENGINE_SRC

# The cache's least recently used entries past its size limit go (never this build's:
# they were just touched).
find "$CACHE" -type f -printf '%T@ %s %p\n' | sort -rn |
  awk -v cap=$((${FUZZ_CACHE_MB:-1024} << 20)) '(sum += $2) > cap { print $3 }' | xargs -r rm -f
