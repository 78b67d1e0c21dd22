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

namespace netreduce {
namespace engine_prefetch {

constexpr int64_t kPrefetchAhead = 2;

inline void PrefetchForRead(const uint8_t* p, size_t n) {
  for (size_t off = 0; off < n; off += 64) __builtin_prefetch(p + off, 0, 3);
}

inline void PrefetchForWrite(const uint8_t* p, size_t n) {
  for (size_t off = 0; off < n; off += 64) __builtin_prefetch(p + off, 1, 3);
}

}  // namespace engine_prefetch
}  // namespace netreduce
