// Prefetching a message's buffers ahead of the engine (engine.cc). A large message's
// src and dst are cold (in DRAM): the ICRC over a chunk's src at its send and the copy
// of its result into dst would wait on memory at every 4 KiB page, where the hardware
// prefetcher stops. Chunks start and complete in sequence order, so the lines of the
// chunk kPrefetchAhead further on are asked for when one starts or lands (0.90 -> 0.79
// CPU-s per GB at MTU 1500). Only for packets with an ICRC (at most 4096 B): a jumbo
// chunk's src is read by the kernel's copy alone, and prefetching 64 KiB chunks made
// loopback slower.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace netreduce {
namespace engine_prefetch {

constexpr int64_t kPrefetchAhead = 2;

// The same lines as one prefetch per 64 bytes from p, four to a loop trip: the loop's
// add, compare and branch per line were two thirds of its instructions, and at MTU 1500
// the two loops were ~8 % of the engine's user-space instructions (callgrind,
// benchmarks/engine_callgrind.py).
template <int kWrite>
inline void PrefetchLines(const uint8_t* p, size_t n) {
  size_t off = 0;
  for (; off + 256 <= n; off += 256) {
    __builtin_prefetch(p + off, kWrite, 3);
    __builtin_prefetch(p + off + 64, kWrite, 3);
    __builtin_prefetch(p + off + 128, kWrite, 3);
    __builtin_prefetch(p + off + 192, kWrite, 3);
  }
  for (; off < n; off += 64) __builtin_prefetch(p + off, kWrite, 3);
}

inline void PrefetchForRead(const uint8_t* p, size_t n) { PrefetchLines<0>(p, n); }

inline void PrefetchForWrite(const uint8_t* p, size_t n) { PrefetchLines<1>(p, n); }

// A message this large has a dst that no cache holds (and will not hold after it):
// results of chunks of at least kStreamMinChunk are copied in with non-temporal
// stores, which write whole lines without reading them first, and dst is not
// prefetched. MTU 9000 (8936-byte chunks), N=4, 64 MiB: engine 0.441 -> 0.412 CPU-s
// per GB; at MTU 1500 (1432-byte chunks, two partial lines each) it was 0.58 -> 0.66,
// so those keep plain stores and the prefetch (BENCHMARKS.md, 12-04).
constexpr size_t kStreamMinBytes = size_t(16) << 20;
constexpr size_t kStreamMinChunk = 8192;

// memcpy with non-temporal stores where the CPU has AVX2 (plain memcpy otherwise);
// StreamFence() after a batch of them, before anyone else reads the bytes.
void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n);
void StreamFence();
inline void PlainCopy(uint8_t* dst, const uint8_t* src, size_t n) { std::memcpy(dst, src, n); }

}  // namespace engine_prefetch
}  // namespace netreduce
