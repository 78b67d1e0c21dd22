// The payload a path carries: the largest P whose whole RoCEv2 datagram, IP header
// included, fits one packet of `mtu` bytes (DF is set, nothing is fragmented):
//   IP (20, or 40 for IPv6) + UDP (8) + BTH (12) + RETH (16) + ImmDt (4) + P + ICRC (4)
// rounded down to a multiple of 8 (so that every dtype's elements fit whole and a
// full chunk needs no pad) and capped at the wire's largest, kMaxPayload. A loopback
// MTU (65536) thus gets the 65464-byte jumbo extension, 9000 gets 8936 and 1500 gets
// 1432. Returns 0 when not even 8 bytes fit.
#pragma once

#include <cstdint>

#include "wire/roce.h"

namespace netreduce {

constexpr uint32_t kUdpHeaderBytes = 8;

inline uint32_t IpHeaderBytes(bool ipv6) { return ipv6 ? 40 : 20; }

inline uint32_t PayloadForMtu(int64_t mtu, bool ipv6) {
  const int64_t overhead = IpHeaderBytes(ipv6) + kUdpHeaderBytes + wire::kHeaderBytes + wire::kIcrcBytes;
  const int64_t room = mtu - overhead;
  if (room < 8) return 0;
  const int64_t p = room / 8 * 8;
  return uint32_t(p < int64_t(wire::kMaxPayload) ? p : int64_t(wire::kMaxPayload));
}

}  // namespace netreduce
