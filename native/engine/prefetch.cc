#include "engine/prefetch.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace netreduce {
namespace engine_prefetch {
namespace {

#if defined(__x86_64__)
// Whole 64-byte lines of dst only: a line written partly by streaming and partly by
// ordinary stores (a chunk's first and last, shared with its neighbours) would leave
// the write-combining buffer in pieces, far slower than either.
__attribute__((target("avx2"))) void StreamCopyAvx2(uint8_t* dst, const uint8_t* src, size_t n) {
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63;
  if (n < head + 64) {
    std::memcpy(dst, src, n);
    return;
  }
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
  }
  std::memcpy(dst + i, src + i, n - i);
}

const bool kAvx2 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
}();
#endif

}  // namespace

void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  if (kAvx2) return StreamCopyAvx2(dst, src, n);
#endif
  std::memcpy(dst, src, n);
}

void StreamFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace engine_prefetch
}  // namespace netreduce
