// Force-included (-include) when building native/reduce/kernels.cc with clang < 15,
// which does not know the "f16c" feature name of __builtin_cpu_supports (GCC does):
// answers that one from CPUID leaf 1 (ECX bit 29) and passes the others through.
#pragma once
#include <cpuid.h>
#include <cstring>

static inline int nr_cpu_supports_shim(const char* f) {
  if (std::strcmp(f, "f16c") == 0) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
  }
  if (std::strcmp(f, "avx2") == 0) return __builtin_cpu_supports("avx2");
  if (std::strcmp(f, "fma") == 0) return __builtin_cpu_supports("fma");
  return 0;
}
#define __builtin_cpu_supports(f) nr_cpu_supports_shim(f)
