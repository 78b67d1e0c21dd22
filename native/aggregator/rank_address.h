// Where one rank's packets come from (its endpoint) and which local address they
// target, as the aggregator answers them (RankAddress): written by whichever data
// thread saw the rank's latest packet, read by every thread that sends the rank a
// result. And where they may come from, as the rank said at admission (BoundSource,
// below): written by the control plane, read per packet.
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
#include <string>

#include "transport/transport.h"

namespace netreduce {

// The writer's side of the seqlock both records below use: take the odd sequence
// number with a CAS (two writers at once stay correct), store the words, release the
// even one. Rare (a rank's first packet, the control plane), so one copy serves both.
template <int N>
inline void SeqlockWrite(std::atomic<uint32_t>& seq, std::atomic<uint64_t> (&words)[N],
                         const uint64_t* n) {
  uint32_t s = seq.load(std::memory_order_relaxed);
  for (;;) {
    if (s & 1) {
      s = seq.load(std::memory_order_relaxed);
      continue;
    }
    if (seq.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) break;
  }
  std::atomic_thread_fence(std::memory_order_release);
  for (int i = 0; i < N; ++i) words[i].store(n[i], std::memory_order_relaxed);
  seq.store(s + 2, std::memory_order_release);
}

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
    SeqlockWrite(seq_, words_, n);
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

// Where a rank's contributions may come from: the data address it gave at admission
// (docs/operations.md, *Security*). An IP address and a run of `span` UDP ports from
// `port` (1 for a rank's own socket, a rack aggregator's data threads for a spine's
// member; 0 = any port: a verbs rank, whose NIC picks the source port per queue pair).
// Unbound, every packet for the rank is refused. Set by the control plane before the
// rank's data flows, read per packet by every data thread: a seqlock, as RankAddress.
class BoundSource {
 public:
  static constexpr uint16_t kMaxSpan = 255;
  // `ip`, ports port..port+span-1 (span <= kMaxSpan; 0 = any port).
  void Store(const IpAddr& ip, uint16_t port, uint16_t span) {
    const Endpoint e = Endpoint::Of(ip, 0);
    uint64_t n[kWords];
    n[0] = uint64_t(e.ip) | uint64_t(port) << 32 | uint64_t(span & 0xFF) << 48 | kBound;
    if (e.v6) n[0] |= kV6;
    std::memcpy(&n[1], e.ip6.bytes, 8);
    std::memcpy(&n[2], e.ip6.bytes + 8, 8);
    Write(n);
  }
  void Clear() {
    const uint64_t n[kWords] = {0, 0, 0};
    Write(n);
  }
  bool bound() const { return Read(0) & kBound; }
  // The same binding as `o` (a job rebuilt with a smaller payload keeps its ranks').
  void CopyFrom(const BoundSource& o) {
    uint64_t n[kWords];
    for (;;) {
      const uint32_t s1 = o.seq_.load(std::memory_order_acquire);
      if (s1 & 1) continue;
      for (int i = 0; i < kWords; ++i) n[i] = o.words_[i].load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (o.seq_.load(std::memory_order_relaxed) == s1) break;
    }
    Write(n);
  }
  // Whether a packet from `from` is the rank's (`any_port`: from its address). Two loads of the sequence and one to
  // three words: the per-packet cost. `seq`, when given: the sequence the answer was
  // read at, which stands for as long as Sequence() still returns it.
  bool Admits(const Endpoint& from, bool any_port = false, uint32_t* seq = nullptr) const {
    uint64_t w0, w1 = 0, w2 = 0;
    for (;;) {
      const uint32_t s1 = seq_.load(std::memory_order_acquire);
      if (s1 & 1) continue;
      w0 = words_[0].load(std::memory_order_relaxed);
      if (from.v6) {
        w1 = words_[1].load(std::memory_order_relaxed);
        w2 = words_[2].load(std::memory_order_relaxed);
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      if (seq_.load(std::memory_order_relaxed) == s1) {
        if (seq != nullptr) *seq = s1;
        break;
      }
    }
    if (!(w0 & kBound) || bool(w0 & kV6) != from.v6) return false;
    if (from.v6) {
      if (std::memcmp(&w1, from.ip6.bytes, 8) != 0 || std::memcmp(&w2, from.ip6.bytes + 8, 8) != 0) {
        return false;
      }
    } else if (uint32_t(w0) != from.ip) {
      return false;
    }
    const uint16_t span = uint8_t(w0 >> 48);
    const uint16_t first = uint16_t(w0 >> 32);
    return any_port || span == 0 || uint16_t(ntohs(from.port) - first) < span;
  }
  // Moves on with every Store or Clear (odd while one is under way): an answer of
  // Admits read at sequence s holds while this returns s (receive_state.h).
  uint32_t Sequence() const { return seq_.load(std::memory_order_acquire); }
  // "10.0.0.5:40001", "[fd00::5]:40001", "10.0.0.5:4791-4794", "10.0.0.5 (any port)".
  std::string Describe() const {
    if (!bound()) return "no address";
    const uint64_t w0 = Read(0), w1 = Read(1), w2 = Read(2);
    Endpoint e;
    e.ip = uint32_t(w0);
    e.v6 = w0 & kV6;
    std::memcpy(e.ip6.bytes, &w1, 8);
    std::memcpy(e.ip6.bytes + 8, &w2, 8);
    const uint16_t port = uint16_t(w0 >> 32), span = uint8_t(w0 >> 48);
    if (span == 0) return ToString(e.address()) + " (any port)";
    std::string s = ToString(e.address(), htons(port));
    if (span > 1) s += "-" + std::to_string(port + span - 1);
    return s;
  }

 private:
  // Word 0: IPv4 (bits 0-31), port (32-47), span (48-55), flags (62, 63); IPv6 (2).
  static constexpr int kWords = 3;
  static constexpr uint64_t kV6 = uint64_t(1) << 62;
  static constexpr uint64_t kBound = uint64_t(1) << 63;

  uint64_t Read(int i) const {
    for (;;) {
      const uint32_t s1 = seq_.load(std::memory_order_acquire);
      if (s1 & 1) continue;
      const uint64_t w = words_[i].load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (seq_.load(std::memory_order_relaxed) == s1) return w;
    }
  }
  void Write(const uint64_t* n) { SeqlockWrite(seq_, words_, n); }

  std::atomic<uint32_t> seq_{0};
  std::atomic<uint64_t> words_[kWords] = {};
};

}  // namespace netreduce
