#!/usr/bin/env bash
# Builds the fuzz harnesses and the sanitizer data-plane test into build/fuzz/ with
# clang (Debian: apt-get install clang; libFuzzer ships with clang's compiler-rt).
#   fuzz/build.sh            decode_fuzzer, aggregator_fuzzer (libFuzzer + ASan + UBSan)
#                            and dataplane_selftest (ASan + UBSan)
# Override the compiler with CXX=clang++-NN.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-clang++}
OUT=build/fuzz
OBJ="$OUT/obj"
mkdir -p "$OUT" "$OBJ"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
FLAGS="-std=c++17 -g -O1 -Inative -fwrapv $SAN"
# every aggregator and engine source, so a new file there cannot leave these unlinked
AGG_SRC="$(ls native/aggregator/*.cc) native/wire/roce.cc $OBJ/kernels.o
         $(ls native/transport/udp/*.cc) native/transport/make_transport.cc"
ENGINE_SRC="$(ls native/engine/*.cc)"
# clang < 15 lacks __builtin_cpu_supports("f16c"): a shim for kernels.cc only.
SHIM=""
if ! echo 'int main(){return __builtin_cpu_supports("f16c");}' | $CXX -x c++ -o /dev/null - 2>/dev/null; then
  SHIM="-include fuzz/clang_cpu_shim.h"
fi
if [ ! "$OBJ/kernels.o" -nt native/reduce/kernels.cc ] || [ ! "$OBJ/kernels.o" -nt fuzz/build.sh ]; then
  # shellcheck disable=SC2086
  $CXX $FLAGS $SHIM -c native/reduce/kernels.cc -o "$OBJ/kernels.o"
fi
build() {  # name, extra flags, sources...
  local name=$1 extra=$2; shift 2
  if [ "$OUT/$name" -nt fuzz/build.sh ] && [ -z "$(find native fuzz -name '*.cc' -newer "$OUT/$name" -o -name '*.h' -newer "$OUT/$name" | head -1)" ]; then
    return  # up to date
  fi
  echo "building $OUT/$name" >&2
  # shellcheck disable=SC2086
  $CXX $FLAGS $extra -o "$OUT/$name" "$@" -lz -lpthread
}
build decode_fuzzer "-fsanitize=fuzzer" fuzz/decode_fuzzer.cc native/wire/roce.cc
# shellcheck disable=SC2086
build aggregator_fuzzer "-fsanitize=fuzzer" fuzz/aggregator_fuzzer.cc $AGG_SRC
# shellcheck disable=SC2086
build dataplane_selftest "" fuzz/dataplane_selftest.cc $AGG_SRC $ENGINE_SRC
