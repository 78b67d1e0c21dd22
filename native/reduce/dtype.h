// Element types and reduction operators as they travel on the wire (4-bit dtype,
// 2-bit op in RETH.VA), and the slot arithmetic the aggregator performs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace netreduce {

enum class DType : uint8_t { kF32 = 0, kF64 = 1, kF16 = 2, kBF16 = 3, kI32 = 4, kI64 = 5 };
constexpr int kNumDTypes = 6;
// Op codes fill the wire's 2-bit field: every value is a valid op (docs/protocol.md).
enum class Op : uint8_t { kSum = 0, kMin = 1, kMax = 2, kProduct = 3 };
constexpr int kNumOps = 4;

inline bool ValidDType(uint8_t d) { return d < kNumDTypes; }
inline bool ValidOp(uint8_t o) { return o < kNumOps; }

// Bytes of one element on the wire.
inline size_t ElementSize(DType d) {
  switch (d) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF16: case DType::kBF16: return 2;
    default: return 4;
  }
}
// Bytes of one element in the slot accumulator: 16-bit floats are summed in float32
// and rounded once on the way out.
inline size_t AccumSize(DType d) {
  return (d == DType::kF16 || d == DType::kBF16) ? 4 : ElementSize(d);
}
const char* DTypeName(DType d);
const char* OpName(Op o);

// acc[i] = in[i] (first contribution, widened for 16-bit floats) or op(acc[i], in[i]).
// `acc` is in accumulator type, `in` in wire type; n elements.
void Accumulate(DType d, Op op, void* acc, const void* in, size_t n, bool first);
// dst[i] = own[i] op other[i], all three in wire type (16-bit floats combined in
// float32 and rounded once); `dst` may be `own`. What a reduce-scatter's owner does
// with the sum of the other ranks' contributions to its own shard.
void CombineInto(DType d, Op op, void* dst, const void* own, const void* other, size_t n);
// dst[i] = src[i] * factor for float32 and float64 (`dst` may be `src`): the factor
// rounded to the element type once, the product in that type -- numpy's multiply of a
// float32 array by a Python float, bit for bit (an Average's 1/N and postscale applied
// as a result is copied into place). False, nothing written, for any other dtype.
bool ScaleInto(DType d, void* dst, const void* src, size_t n, double factor);
// Turn a finished accumulator into wire type, in place (narrowing 16-bit floats into
// the first half of the buffer; a no-op for the other dtypes).
void Finish(DType d, void* acc, size_t n);

// Which kernel set runtime dispatch chose ("avx2+f16c" or "generic").
const char* SimdPath();
// Accumulate on a named kernel set ("generic", or "avx2+f16c" where the CPU has it),
// whatever dispatch chose: tests and benchmarks compare the two. False: not here.
bool AccumulateOn(const char* simd, DType d, Op op, void* acc, const void* in, size_t n,
                  bool first);
bool FinishOn(const char* simd, DType d, void* acc, size_t n);

}  // namespace netreduce
