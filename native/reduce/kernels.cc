// Reduction kernels with runtime dispatch: the same loop templates are compiled once
// for the baseline x86-64 ISA and once inside functions tagged target("avx2,f16c,fma");
// the choice is made once, from cpuid, so the installed extension needs no
// -march=native and still uses AVX2 where the CPU has it.
#include <cmath>
#include <cstring>
#include <string>
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
  // Infinity; a NaN quietened with its payload's top bits kept, as F16C's VCVTPS2PH
  // does (the two kernel sets agree bit for bit).
  if (absx >= 0x7F800000) {
    return uint16_t(sign | 0x7C00 | (absx > 0x7F800000 ? 0x200 | ((absx & 0x7FFFFF) >> 13) : 0));
  }
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

// Min and max of floats are IEEE 754-2019's minimum and maximum, what numpy's
// np.minimum / np.maximum give for NaN: a NaN on either side gives NaN there, whichever
// rank holds it, and -0 < +0: min(-0, +0) = -0 and max(-0, +0) = +0 either way round.
// x86's MINPS / MAXPS (what `a < b ? a : b` compiles to) return their second operand
// when either is NaN and when both are equal, zeros of either sign included, so each is
// taken both ways round and the two combined bitwise: OR for min (-0 wins), AND for max
// (+0 wins); identical values are unchanged by either. A NaN lane is then set to all
// ones (a NaN), so a result's bits depend neither on which rank's NaN it was nor on the
// order contributions came in. Four vector instructions where a plain MINPS was one
// (BENCHMARKS.md, "NaN in min and max": what that costs per GB).
template <typename T>
struct BitsOf {
  using type = typename std::conditional<sizeof(T) == 8, uint64_t, uint32_t>::type;
};

template <typename T, bool kMax>
__attribute__((always_inline)) inline T IeeeMinMax(T a, T b) {
  using U = typename BitsOf<T>::type;
  const T t = kMax ? (a > b ? a : b) : (a < b ? a : b);
  const T u = kMax ? (b > a ? b : a) : (b < a ? b : a);
  U tb, ub;
  std::memcpy(&tb, &t, sizeof(T));
  std::memcpy(&ub, &u, sizeof(T));
  const U nan = (a != a) | (b != b) ? ~U(0) : U(0);
  const U r = (kMax ? (tb & ub) : (tb | ub)) | nan;
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}

template <typename T, Op kOp>
__attribute__((always_inline)) inline T MinOrMax(T acc, T v) {
  if constexpr (std::is_floating_point<T>::value) {
    return IeeeMinMax<T, kOp == Op::kMax>(acc, v);
  } else if constexpr (kOp == Op::kMin) {
    return v < acc ? v : acc;
  } else {
    return v > acc ? v : acc;
  }
}

#if NR_X86
// IeeeMinMax on SSE vectors (baseline x86-64), and loops of them over whole vectors:
// each returns how many elements it did, the rest being the caller's.
template <bool kMax>
__attribute__((always_inline)) inline __m128 MinMaxV(__m128 a, __m128 b) {
  const __m128 r = kMax ? _mm_and_ps(_mm_max_ps(a, b), _mm_max_ps(b, a))
                        : _mm_or_ps(_mm_min_ps(a, b), _mm_min_ps(b, a));
  return _mm_or_ps(r, _mm_cmpunord_ps(a, b));
}
template <bool kMax>
__attribute__((always_inline)) inline __m128d MinMaxV(__m128d a, __m128d b) {
  const __m128d r = kMax ? _mm_and_pd(_mm_max_pd(a, b), _mm_max_pd(b, a))
                         : _mm_or_pd(_mm_min_pd(a, b), _mm_min_pd(b, a));
  return _mm_or_pd(r, _mm_cmpunord_pd(a, b));
}

template <typename T, bool kMax>
__attribute__((always_inline)) inline size_t MinMaxSse(T* acc, const uint8_t* in, size_t n) {
  size_t i = 0;
  if constexpr (sizeof(T) == 4) {
    for (; i + 4 <= n; i += 4) {
      const __m128 v = _mm_loadu_ps(reinterpret_cast<const float*>(in + i * 4));
      _mm_storeu_ps(acc + i, MinMaxV<kMax>(_mm_loadu_ps(acc + i), v));
    }
  } else {
    for (; i + 2 <= n; i += 2) {
      const __m128d v = _mm_loadu_pd(reinterpret_cast<const double*>(in + i * 8));
      _mm_storeu_pd(acc + i, MinMaxV<kMax>(_mm_loadu_pd(acc + i), v));
    }
  }
  return i;
}

template <bool kMax>
__attribute__((always_inline)) inline size_t MinMaxBf16Sse(float* acc, const uint16_t* in,
                                                           size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {  // a bfloat16 is the upper half of its float32
    const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + i));
    const __m128 v = _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
    _mm_storeu_ps(acc + i, MinMaxV<kMax>(_mm_loadu_ps(acc + i), v));
  }
  return i;
}
#endif

// `in` is read with memcpy: a contribution may sit at any 4-byte boundary (the
// segments of a coalesced UDP GRO receive follow one another at datagram lengths, all
// multiples of 4 only), so 8-byte elements may be misaligned; the compiler still emits
// plain (unaligned) vector loads. The accumulators are always aligned.
template <typename T, Op kOp>
__attribute__((always_inline)) inline void Combine(T* __restrict acc,
                                                   const uint8_t* __restrict in, size_t n) {
  size_t i = 0;
#if NR_X86
  if constexpr (std::is_floating_point<T>::value && (kOp == Op::kMin || kOp == Op::kMax)) {
    i = MinMaxSse<T, kOp == Op::kMax>(acc, in, n);
  }
#endif
  for (; i < n; ++i) {
    T v;
    std::memcpy(&v, in + i * sizeof(T), sizeof(T));
    if (kOp == Op::kSum) acc[i] += v;
    else if (kOp == Op::kMin || kOp == Op::kMax) acc[i] = MinOrMax<T, kOp>(acc[i], v);
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
  size_t i = 0;
#if NR_X86
  if constexpr (kOp == Op::kMin || kOp == Op::kMax) i = MinMaxBf16Sse<kOp == Op::kMax>(acc, in, n);
#endif
  for (; i < n; ++i) {
    uint32_t bits = uint32_t(in[i]) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    if (kOp == Op::kSum) acc[i] += v;
    else if (kOp == Op::kMin || kOp == Op::kMax) acc[i] = MinOrMax<float, kOp>(acc[i], v);
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
    case DType::kF16: {  // widened a block at a time, then combined as float32
      float* a = static_cast<float*>(acc);
      const uint16_t* s = static_cast<const uint16_t*>(in);
      constexpr size_t kBlock = 256;
      float wide[kBlock];
      for (size_t i = 0; i < n; i += kBlock) {
        const size_t m = n - i < kBlock ? n - i : kBlock;
        float* to = first ? a + i : wide;
        for (size_t j = 0; j < m; ++j) to[j] = HalfToFloat(s[i + j]);
        if (!first) CombineOp(op, a + i, reinterpret_cast<const uint8_t*>(wide), m);
      }
      return;
    }
  }
}

void AccumulateBaseline(DType d, Op op, void* acc, const void* in, size_t n, bool first) {
  AccumulateGeneric(d, op, acc, in, n, first);
}

#if NR_X86
// IeeeMinMax on AVX vectors; and min/max of float32, float64 and bfloat16 over whole
// vectors (returns how many elements it did).
template <bool kMax>
__attribute__((always_inline, target("avx2,f16c,fma"))) inline __m256 MinMaxV(__m256 a, __m256 b) {
  const __m256 r = kMax ? _mm256_and_ps(_mm256_max_ps(a, b), _mm256_max_ps(b, a))
                        : _mm256_or_ps(_mm256_min_ps(a, b), _mm256_min_ps(b, a));
  return _mm256_or_ps(r, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}
template <bool kMax>
__attribute__((always_inline, target("avx2,f16c,fma"))) inline __m256d MinMaxV(__m256d a,
                                                                               __m256d b) {
  const __m256d r = kMax ? _mm256_and_pd(_mm256_max_pd(a, b), _mm256_max_pd(b, a))
                         : _mm256_or_pd(_mm256_min_pd(a, b), _mm256_min_pd(b, a));
  return _mm256_or_pd(r, _mm256_cmp_pd(a, b, _CMP_UNORD_Q));
}

template <bool kMax>
__attribute__((always_inline, target("avx2,f16c,fma"))) inline size_t MinMaxAvx(
    DType d, void* acc, const void* in, size_t n) {
  size_t i = 0;
  if (d == DType::kF32) {
    float* a = static_cast<float*>(acc);
    const uint8_t* s = static_cast<const uint8_t*>(in);
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(s + i * 4));
      _mm256_storeu_ps(a + i, MinMaxV<kMax>(_mm256_loadu_ps(a + i), v));
    }
  } else if (d == DType::kF64) {
    double* a = static_cast<double*>(acc);
    const uint8_t* s = static_cast<const uint8_t*>(in);
    for (; i + 4 <= n; i += 4) {
      const __m256d v = _mm256_loadu_pd(reinterpret_cast<const double*>(s + i * 8));
      _mm256_storeu_pd(a + i, MinMaxV<kMax>(_mm256_loadu_pd(a + i), v));
    }
  } else if (d == DType::kBF16) {
    float* a = static_cast<float*>(acc);
    const uint16_t* s = static_cast<const uint16_t*>(in);
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      _mm256_storeu_ps(a + i, MinMaxV<kMax>(_mm256_loadu_ps(a + i), v));
    }
  }
  return i;
}

__attribute__((target("avx2,f16c,fma"))) void AccumulateAvx2(DType d, Op op, void* acc,
                                                             const void* in, size_t n,
                                                             bool first) {
  if (!first && (op == Op::kMin || op == Op::kMax) &&
      (d == DType::kF32 || d == DType::kF64 || d == DType::kBF16)) {
    const size_t i = op == Op::kMax ? MinMaxAvx<true>(d, acc, in, n)
                                    : MinMaxAvx<false>(d, acc, in, n);
    const size_t acc_es = AccumSize(d), in_es = ElementSize(d);
    if (i < n) {
      AccumulateGeneric(d, op, static_cast<uint8_t*>(acc) + i * acc_es,
                        static_cast<const uint8_t*>(in) + i * in_es, n - i, false);
    }
    return;
  }
  if (!first && op == Op::kSum && d == DType::kF32) {  // the gradients' case, by hand:
    // four vectors a loop trip (the compiler's loop did one, with its add, compare and
    // branch per 8 floats). Each element is acc + in, as the scalar loop: bit for bit.
    float* a = static_cast<float*>(acc);
    const float* s = static_cast<const float*>(in);  // acc 8-byte aligned, in 4: loadu
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m256 x0 = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(s + i));
      const __m256 x1 = _mm256_add_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(s + i + 8));
      const __m256 x2 = _mm256_add_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(s + i + 16));
      const __m256 x3 = _mm256_add_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(s + i + 24));
      _mm256_storeu_ps(a + i, x0);
      _mm256_storeu_ps(a + i + 8, x1);
      _mm256_storeu_ps(a + i + 16, x2);
      _mm256_storeu_ps(a + i + 24, x3);
    }
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(s + i)));
    }
    if (i < n) AccumulateGeneric(d, op, a + i, s + i, n - i, false);
    return;
  }
  if (d == DType::kF16) {  // F16C converts 8 halves per instruction
    float* a = static_cast<float*>(acc);
    const uint16_t* s = static_cast<const uint16_t*>(in);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
      if (!first) {
        __m256 cur = _mm256_loadu_ps(a + i);
        if (op == Op::kSum) {
          v = _mm256_add_ps(cur, v);
        } else if (op == Op::kMin) {
          v = MinMaxV<false>(cur, v);
        } else if (op == Op::kMax) {
          v = MinMaxV<true>(cur, v);
        } else {
          v = _mm256_mul_ps(cur, v);
        }
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

namespace {

void FinishOn(bool avx2, DType d, void* acc, size_t n) {
  float* a = static_cast<float*>(acc);
  if (d == DType::kBF16) {
    uint16_t* out = static_cast<uint16_t*>(acc);
    for (size_t i = 0; i < n; ++i) out[i] = FloatToBf16(a[i]);
  } else if (d == DType::kF16) {
#if NR_X86
    if (avx2) { FinishF16Avx2(a, n); return; }
#endif
    (void)avx2;
    uint16_t* out = static_cast<uint16_t*>(acc);
    for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(a[i]);
  }
}

}  // namespace

void Finish(DType d, void* acc, size_t n) { FinishOn(GetDispatch().avx2, d, acc, n); }

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

namespace {
template <typename T>
void ScaleT(T* dst, const T* src, size_t n, T f) {
  for (size_t i = 0; i < n; ++i) dst[i] = src[i] * f;  // no FMA, no reassociation: exact
}
}  // namespace

bool ScaleInto(DType d, void* dst, const void* src, size_t n, double factor) {
  switch (d) {
    case DType::kF32:
      ScaleT(static_cast<float*>(dst), static_cast<const float*>(src), n, float(factor));
      return true;
    case DType::kF64:
      ScaleT(static_cast<double*>(dst), static_cast<const double*>(src), n, factor);
      return true;
    default:
      return false;
  }
}

const char* SimdPath() { return GetDispatch().avx2 ? "avx2+f16c" : "generic"; }

bool AccumulateOn(const char* simd, DType d, Op op, void* acc, const void* in, size_t n,
                  bool first) {
  const std::string want = simd;
  if (want == "generic") {
    AccumulateBaseline(d, op, acc, in, n, first);
    return true;
  }
#if NR_X86
  if (want == "avx2+f16c" && GetDispatch().avx2) {
    AccumulateAvx2(d, op, acc, in, n, first);
    return true;
  }
#endif
  return false;
}

bool FinishOn(const char* simd, DType d, void* acc, size_t n) {
  const std::string want = simd;
  const bool avx2 = want == "avx2+f16c";
  if (!avx2 && want != "generic") return false;
  if (avx2 && !GetDispatch().avx2) return false;
  FinishOn(avx2, d, acc, n);
  return true;
}

const char* DTypeName(DType d) {
  static const char* kNames[] = {"float32", "float64", "float16", "bfloat16", "int32", "int64"};
  return ValidDType(uint8_t(d)) ? kNames[int(d)] : "unknown";
}
const char* OpName(Op o) {
  static const char* kNames[] = {"sum", "min", "max", "product"};
  return ValidOp(uint8_t(o)) ? kNames[int(o)] : "unknown";
}

}  // namespace netreduce
