#include "transport/udp/gso_runs.h"

#include <cstring>

namespace netreduce {
namespace {

// Destination and source of a packet, as one hash (the table compares in full).
uint64_t KeyHash(const OutPacket& p) {
  uint64_t h = (uint64_t(p.to.ip) << 16) ^ p.to.port ^ (uint64_t(p.from_ip) << 32);
  if (p.to.v6) {
    uint64_t w[2];
    std::memcpy(w, p.to.ip6.bytes, 16);
    h ^= w[0] * 0x9E3779B97F4A7C15ull ^ w[1];
  }
  if (!p.from_ip6.unspecified()) {
    uint64_t w[2];
    std::memcpy(w, p.from_ip6.bytes, 16);
    h ^= (w[0] ^ w[1]) * 0xC2B2AE3D27D4EB4Full;
  }
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
}

bool SameFlow(const OutPacket& a, const OutPacket& b) {
  return a.to == b.to && a.from_ip == b.from_ip && a.from_ip6 == b.from_ip6;
}

}  // namespace

void GsoRuns::Plan(const OutPacket* pkts, size_t n, uint32_t max_segments, uint32_t max_bytes) {
  runs_.clear();
  next_.resize(n);
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  table_.assign(cap, -1);
  const size_t mask = cap - 1;
  constexpr size_t kNone = ~size_t(0);
  size_t last_at = kNone;  // the table entry of the last segmentable packet's flow
  for (uint32_t i = 0; i < n; ++i) {
    const OutPacket& p = pkts[i];
    const uint32_t len = uint32_t(PacketBytes(p));
    if (!p.segmentable) {
      GsoRun r;
      r.first = r.last = i;
      r.count = 1;
      r.seg = r.bytes = len;
      r.closed = true;
      runs_.push_back(r);
      continue;
    }
    // The flow of the packet before is the likeliest (with one aggregator thread every
    // packet of a batch has one): its table entry is tried before the hash.
    size_t at = last_at;
    if (last_at == kNone || !SameFlow(pkts[runs_[size_t(table_[at])].first], p)) {
      at = KeyHash(p) & mask;
      while (table_[at] >= 0 && !SameFlow(pkts[runs_[size_t(table_[at])].first], p)) {
        at = (at + 1) & mask;
      }
    }
    last_at = at;
    if (table_[at] >= 0) {
      GsoRun& r = runs_[size_t(table_[at])];
      if (!r.closed && len <= r.seg && r.count < max_segments && r.bytes + len <= max_bytes) {
        next_[r.last] = i;
        r.last = i;
        r.count++;
        r.bytes += len;
        if (len < r.seg) r.closed = true;  // only the last segment may be shorter
        continue;
      }
    }
    GsoRun r;
    r.first = r.last = i;
    r.count = 1;
    r.seg = r.bytes = len;
    table_[at] = int32_t(runs_.size());  // the destination's open run is now this one
    runs_.push_back(r);
  }
}

}  // namespace netreduce
