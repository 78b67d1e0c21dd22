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
    uint64_t w0, w1, w2, w3, w4;
    for (;;) {
      const uint32_t s1 = seq_.load(std::memory_order_acquire);
      if (s1 & 1) continue;
      w0 = words_[0].load(std::memory_order_relaxed);
      w1 = words_[1].load(std::memory_order_relaxed);
      w2 = words_[2].load(std::memory_order_relaxed);
      w3 = words_[3].load(std::memory_order_relaxed);
      w4 = words_[4].load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (seq_.load(std::memory_order_relaxed) == s1) break;
    }
    // Field by field from registers: assembling the record in a stack buffer and
    // copying it out in 16-byte pieces stalled every result on store forwarding.
    peer->ip = uint32_t(w0);
    peer->port = uint16_t(w0 >> 32);
    peer->v6 = (w0 >> 48) & 1;
    std::memcpy(peer->ip6.bytes, &w1, 8);
    std::memcpy(peer->ip6.bytes + 8, &w2, 8);
    if ((w0 >> 56) & 1) {
      std::memcpy(local->bytes, &w3, 8);
      std::memcpy(local->bytes + 8, &w4, 8);
    } else {
      *local = IpAddr::V4(uint32_t(w3));
    }
  }

  // The rank's endpoint and the local address it targeted: IPv6 when local_v6 is
  // set, else the IPv4 local_v4 (InPacket::local_address()). No-op when the record
  // already holds them, which is every packet but the first.
  void Store(const Endpoint& peer, uint32_t local_v4, const IpAddr& local_v6) {
    const bool v6_local = !local_v6.unspecified();
    uint64_t n[kWords];
    n[0] = uint64_t(peer.ip) | uint64_t(peer.port) << 32 | uint64_t(peer.v6 ? 1 : 0) << 48 |
           uint64_t(v6_local ? 1 : 0) << 56;
    std::memcpy(&n[1], peer.ip6.bytes, 8);
    std::memcpy(&n[2], peer.ip6.bytes + 8, 8);
    if (v6_local) {
      std::memcpy(&n[3], local_v6.bytes, 8);
      std::memcpy(&n[4], local_v6.bytes + 8, 8);
    } else {
      n[3] = local_v4;
      n[4] = 0;
    }
    if (Holds(n)) return;
    uint32_t s = seq_.load(std::memory_order_relaxed);
    for (;;) {
      if (s & 1) {
        s = seq_.load(std::memory_order_relaxed);
        continue;
      }
      if (seq_.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) break;
    }
    std::atomic_thread_fence(std::memory_order_release);
    for (int i = 0; i < kWords; ++i) words_[i].store(n[i], std::memory_order_relaxed);
    seq_.store(s + 2, std::memory_order_release);
  }

 private:
  static constexpr int kWords = 5;  // flags + peer IPv4 + port, peer IPv6 (2), local (2)

  // Whether a consistent read of the record equals n, compared word by word.
  bool Holds(const uint64_t* n) const {
    for (;;) {
      const uint32_t s1 = seq_.load(std::memory_order_acquire);
      if (s1 & 1) continue;
      bool same = true;
      for (int i = 0; i < kWords; ++i) same &= words_[i].load(std::memory_order_relaxed) == n[i];
      std::atomic_thread_fence(std::memory_order_acquire);
      if (seq_.load(std::memory_order_relaxed) == s1) return same;
    }
  }

  std::atomic<uint32_t> seq_{0};
  std::atomic<uint64_t> words_[kWords] = {};
};

}  // namespace netreduce
