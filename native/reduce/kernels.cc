// Reduction kernels with runtime dispatch: the same loop templates are compiled once
// for the baseline x86-64 ISA and once inside functions tagged target("avx2,f16c,fma");
// the choice is made once, from cpuid, so the installed extension needs no
// -march=native and still uses AVX2 where the CPU has it.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "reduce/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define NR_X86 1
#endif

namespace netreduce {
namespace {

// ---- scalar half <-> float (portable, round-to-nearest-even) ----------------
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) { mant <<= 1; --exp; }
      mant &= 0x3FF;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t absx = x & 0x7FFFFFFF;
  if (absx >= 0x7F800000) return uint16_t(sign | 0x7C00 | (absx > 0x7F800000 ? 0x200 : 0));
  if (absx >= 0x477FF000) return uint16_t(sign | 0x7C00);  // rounds to inf
  if (absx < 0x38800000) {                                  // subnormal or zero half
    if (absx < 0x33000000) return uint16_t(sign);
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = ((absx >> 13) - ((127 - 15) << 10));
  const uint32_t rem = absx & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return uint16_t(sign | r);
}

inline float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return uint16_t((x >> 16) | 0x40);  // quiet NaN
  x += 0x7FFF + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

// ---- loop templates, inlined into each ISA's entry point --------------------
// Integer products wrap modulo 2^bits, as numpy's and Horovod's do; multiplying in
// the unsigned type gives that without signed overflow (undefined behaviour).
template <typename T>
__attribute__((always_inline)) inline T Multiply(T a, T b) {
  if constexpr (std::is_integral<T>::value) {
    using U = typename std::make_unsigned<T>::type;
    return T(U(a) * U(b));
  } else {
    return a * b;
  }
}

// `in` is read with memcpy: a contribution may sit at any 4-byte boundary (the
// segments of a coalesced UDP GRO receive follow one another at datagram lengths, all
// multiples of 4 only), so 8-byte elements may be misaligned; the compiler still emits
// plain (unaligned) vector loads. The accumulators are always aligned.
template <typename T, Op kOp>
__attribute__((always_inline)) inline void Combine(T* __restrict acc,
                                                   const uint8_t* __restrict in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, in + i * sizeof(T), sizeof(T));
    if (kOp == Op::kSum) acc[i] += v;
    else if (kOp == Op::kMin) acc[i] = v < acc[i] ? v : acc[i];
    else if (kOp == Op::kMax) acc[i] = v > acc[i] ? v : acc[i];
    else acc[i] = Multiply(acc[i], v);
  }
}

template <typename T>
__attribute__((always_inline)) inline void CombineOp(Op op, T* acc, const uint8_t* in, size_t n) {
  switch (op) {
    case Op::kSum: Combine<T, Op::kSum>(acc, in, n); break;
    case Op::kMin: Combine<T, Op::kMin>(acc, in, n); break;
    case Op::kMax: Combine<T, Op::kMax>(acc, in, n); break;
    case Op::kProduct: Combine<T, Op::kProduct>(acc, in, n); break;
  }
}

template <Op kOp>
__attribute__((always_inline)) inline void CombineWidenBf16(float* __restrict acc,
                                                            const uint16_t* __restrict in,
                                                            size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = uint32_t(in[i]) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    if (kOp == Op::kSum) acc[i] += v;
    else if (kOp == Op::kMin) acc[i] = v < acc[i] ? v : acc[i];
    else if (kOp == Op::kMax) acc[i] = v > acc[i] ? v : acc[i];
    else acc[i] *= v;
  }
}

__attribute__((always_inline)) inline void AccumulateGeneric(DType d, Op op, void* acc,
                                                             const void* in, size_t n,
                                                             bool first) {
  switch (d) {
    case DType::kF32:
    case DType::kI32:
    case DType::kF64:
    case DType::kI64:
      if (first) {
        std::memcpy(acc, in, n * ElementSize(d));
      } else if (d == DType::kF32) {
        CombineOp(op, static_cast<float*>(acc), static_cast<const uint8_t*>(in), n);
      } else if (d == DType::kI32) {
        CombineOp(op, static_cast<int32_t*>(acc), static_cast<const uint8_t*>(in), n);
      } else if (d == DType::kF64) {
        CombineOp(op, static_cast<double*>(acc), static_cast<const uint8_t*>(in), n);
      } else {
        CombineOp(op, static_cast<int64_t*>(acc), static_cast<const uint8_t*>(in), n);
      }
      return;
    case DType::kBF16: {
      float* a = static_cast<float*>(acc);
      const uint16_t* s = static_cast<const uint16_t*>(in);
      if (first) {
        for (size_t i = 0; i < n; ++i) a[i] = Bf16ToFloat(s[i]);
      } else if (op == Op::kSum) {
        CombineWidenBf16<Op::kSum>(a, s, n);
      } else if (op == Op::kMin) {
        CombineWidenBf16<Op::kMin>(a, s, n);
      } else if (op == Op::kMax) {
        CombineWidenBf16<Op::kMax>(a, s, n);
      } else {
        CombineWidenBf16<Op::kProduct>(a, s, n);
      }
      return;
    }
    case DType::kF16: {
      float* a = static_cast<float*>(acc);
      const uint16_t* s = static_cast<const uint16_t*>(in);
      for (size_t i = 0; i < n; ++i) {
        const float v = HalfToFloat(s[i]);
        if (first) a[i] = v;
        else if (op == Op::kSum) a[i] += v;
        else if (op == Op::kMin) a[i] = v < a[i] ? v : a[i];
        else if (op == Op::kMax) a[i] = v > a[i] ? v : a[i];
        else a[i] *= v;
      }
      return;
    }
  }
}

void AccumulateBaseline(DType d, Op op, void* acc, const void* in, size_t n, bool first) {
  AccumulateGeneric(d, op, acc, in, n, first);
}

#if NR_X86
__attribute__((target("avx2,f16c,fma"))) void AccumulateAvx2(DType d, Op op, void* acc,
                                                             const void* in, size_t n,
                                                             bool first) {
  if (d == DType::kF16) {  // F16C converts 8 halves per instruction
    float* a = static_cast<float*>(acc);
    const uint16_t* s = static_cast<const uint16_t*>(in);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
      if (!first) {
        __m256 cur = _mm256_loadu_ps(a + i);
        if (op == Op::kSum) v = _mm256_add_ps(cur, v);
        else if (op == Op::kMin) v = _mm256_min_ps(v, cur);
        else if (op == Op::kMax) v = _mm256_max_ps(v, cur);
        else v = _mm256_mul_ps(cur, v);
      }
      _mm256_storeu_ps(a + i, v);
    }
    if (i < n) AccumulateGeneric(d, op, a + i, s + i, n - i, first);
    return;
  }
  AccumulateGeneric(d, op, acc, in, n, first);
}

__attribute__((target("avx2,f16c,fma"))) void FinishF16Avx2(float* a, size_t n) {
  uint16_t* out = reinterpret_cast<uint16_t*>(a);
  size_t i = 0;
  // Narrowing forward in place is safe: element i's output (bytes 2i..2i+1) never
  // overlaps an input not yet read (bytes >= 4i), and each 8-wide load precedes its
  // store.
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(a + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = FloatToHalf(a[i]);
}
#endif

using AccumulateFn = void (*)(DType, Op, void*, const void*, size_t, bool);

struct Dispatch {
  AccumulateFn accumulate = AccumulateBaseline;
  bool avx2 = false;
  Dispatch() {
#if NR_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
        __builtin_cpu_supports("fma")) {
      accumulate = AccumulateAvx2;
      avx2 = true;
    }
#endif
  }
};

const Dispatch& GetDispatch() {
  static const Dispatch d;
  return d;
}

}  // namespace

void Accumulate(DType d, Op op, void* acc, const void* in, size_t n, bool first) {
  GetDispatch().accumulate(d, op, acc, in, n, first);
}

void Finish(DType d, void* acc, size_t n) {
  float* a = static_cast<float*>(acc);
  if (d == DType::kBF16) {
    uint16_t* out = static_cast<uint16_t*>(acc);
    for (size_t i = 0; i < n; ++i) out[i] = FloatToBf16(a[i]);
  } else if (d == DType::kF16) {
#if NR_X86
    if (GetDispatch().avx2) { FinishF16Avx2(a, n); return; }
#endif
    uint16_t* out = static_cast<uint16_t*>(acc);
    for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(a[i]);
  }
}

void CombineInto(DType d, Op op, void* dst, const void* own, const void* other, size_t n) {
  const size_t es = ElementSize(d);
  if (AccumSize(d) == es) {
    if (dst != own) std::memmove(dst, own, n * es);
    Accumulate(d, op, dst, other, n, false);
    return;
  }
  // 16-bit floats: widen a block, combine, narrow once (Finish packs the halves into
  // the block's first half).
  constexpr size_t kBlock = 1024;
  float wide[kBlock];
  uint8_t* out = static_cast<uint8_t*>(dst);
  const uint8_t* a = static_cast<const uint8_t*>(own);
  const uint8_t* b = static_cast<const uint8_t*>(other);
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = n - i < kBlock ? n - i : kBlock;
    Accumulate(d, op, wide, a + i * es, m, true);
    Accumulate(d, op, wide, b + i * es, m, false);
    Finish(d, wide, m);
    std::memcpy(out + i * es, wide, m * es);
  }
}

const char* SimdPath() { return GetDispatch().avx2 ? "avx2+f16c" : "generic"; }

const char* DTypeName(DType d) {
  static const char* kNames[] = {"float32", "float64", "float16", "bfloat16", "int32", "int64"};
  return ValidDType(uint8_t(d)) ? kNames[int(d)] : "unknown";
}
const char* OpName(Op o) {
  static const char* kNames[] = {"sum", "min", "max", "product"};
  return ValidOp(uint8_t(o)) ? kNames[int(o)] : "unknown";
}

}  // namespace netreduce
