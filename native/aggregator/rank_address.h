// Where one rank's packets come from (its endpoint) and which local address they
// target, as the aggregator answers them. Written by whichever data thread saw the
// rank's latest packet, read by every thread that sends the rank a result.
//
// An IPv6 endpoint and local address are 34 bytes, too wide for one atomic, so the
// record is a seqlock (Boehm, "Can seqlocks get along with programming language
// memory models?", 2012): readers retry on a torn read and never block; a writer
// takes the odd sequence number with a CAS, so two threads storing at once (two data
// ports receiving the same rank) stay correct. The value almost never changes, and
// Store() checks before writing, so the hot path is two loads of the sequence.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "transport/transport.h"

namespace netreduce {

class RankAddress {
 public:
  void Load(Endpoint* peer, IpAddr* local) const {
    uint64_t w[kWords];
    for (;;) {
      const uint32_t s1 = seq_.load(std::memory_order_acquire);
      if (s1 & 1) continue;
      for (int i = 0; i < kWords; ++i) w[i] = words_[i].load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (seq_.load(std::memory_order_relaxed) == s1) break;
    }
    IpAddr addr;
    std::memcpy(addr.bytes, &w[0], 16);
    std::memcpy(local->bytes, &w[2], 16);
    *peer = Endpoint::Of(addr, uint16_t(w[4]));
  }

  // No-op when the record already holds these addresses.
  void Store(const Endpoint& peer, const IpAddr& local) {
    Endpoint old_peer;
    IpAddr old_local;
    Load(&old_peer, &old_local);
    if (old_peer == peer && old_local == local) return;
    uint64_t w[kWords];
    std::memcpy(&w[0], peer.address().bytes, 16);
    std::memcpy(&w[2], local.bytes, 16);
    w[4] = peer.port;
    uint32_t s = seq_.load(std::memory_order_relaxed);
    for (;;) {
      if (s & 1) {
        s = seq_.load(std::memory_order_relaxed);
        continue;
      }
      if (seq_.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) break;
    }
    std::atomic_thread_fence(std::memory_order_release);
    for (int i = 0; i < kWords; ++i) words_[i].store(w[i], std::memory_order_relaxed);
    seq_.store(s + 2, std::memory_order_release);
  }

 private:
  static constexpr int kWords = 5;  // peer address (2), local address (2), peer port
  std::atomic<uint32_t> seq_{0};
  std::atomic<uint64_t> words_[kWords] = {};
};

}  // namespace netreduce
