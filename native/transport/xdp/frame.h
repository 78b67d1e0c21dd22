// Ethernet frames of the AF_XDP transport: the Ethernet + IPv4/IPv6 + UDP headers it
// writes in front of each datagram (the kernel's socket did that for the UDP
// transport), and the parse of a received frame back to its datagram. Nothing here
// knows RoCE: the datagram is whatever the caller gathered (BTH.., payload, ICRC).
//
// What a frame must carry for the RoCEv2 ICRC that the caller computed to hold
// (wire/roce.h): IPv4 with ID 0 and DF set, no options; IPv6 with the next header
// UDP, no extension headers. The variant fields (TOS/TTL/checksum, traffic class/
// flow label/hop limit) are masked in the ICRC, so their values are ours: TOS 0 and
// traffic class 0, flow label 0, TTL and hop limit 64.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/ip_address.h"

namespace netreduce {
namespace xdp {

constexpr size_t kEthBytes = 14;
constexpr size_t kIp4Bytes = 20;
constexpr size_t kIp6Bytes = 40;
constexpr size_t kUdpBytes = 8;
constexpr uint8_t kHopLimit = 64;

struct Mac {
  uint8_t b[6] = {};
  bool operator==(const Mac& o) const {
    for (int i = 0; i < 6; ++i) if (b[i] != o.b[i]) return false;
    return true;
  }
  bool zero() const { return *this == Mac(); }
};

// The multicast MAC an IPv4 group maps to (RFC 1112: 01:00:5e + low 23 bits) or an
// IPv6 group (RFC 2464: 33:33 + low 32 bits).
Mac MulticastMac(const IpAddr& group);

// Bytes of Ethernet + IP + UDP header for a datagram of this family.
inline size_t HeaderBytes(bool v6) { return kEthBytes + (v6 ? kIp6Bytes : kIp4Bytes) + kUdpBytes; }

// Ones'-complement sum (RFC 1071) of `n` bytes, folded into the running 32-bit sum
// `acc`; `odd` says the bytes start at an odd offset of the summed stream (and is
// updated), so a datagram may be summed in pieces of any length.
uint32_t ChecksumAdd(uint32_t acc, const uint8_t* p, size_t n, bool* odd);
// The same while copying the bytes to `dst` (one pass over them instead of two).
uint32_t ChecksumCopy(uint32_t acc, uint8_t* dst, const uint8_t* p, size_t n, bool* odd);
// The final 16-bit checksum of a sum, network order, ready to store.
uint16_t ChecksumFinish(uint32_t acc);

// Writes the Ethernet, IP and UDP headers of a datagram of `udp_payload` bytes to
// `out` (HeaderBytes(v6) of them; the family is dst's) with the UDP checksum field 0.
// Returns the pseudo-header + UDP-header partial sum the caller completes with
// ChecksumAdd over the datagram and stores with StoreUdpChecksum.
uint32_t WriteHeaders(uint8_t* out, const Mac& src_mac, const Mac& dst_mac, const IpAddr& src,
                      uint16_t src_port_be, const IpAddr& dst, uint16_t dst_port_be,
                      size_t udp_payload);
// Stores the UDP checksum in headers WriteHeaders wrote (a computed 0 is sent as
// 0xFFFF, RFC 768: 0 means "none", which IPv6 forbids).
void StoreUdpChecksum(uint8_t* headers, bool v6, uint32_t acc);

// A received frame's datagram: where its UDP payload starts in the frame, its length
// (from the UDP header: Ethernet pads short frames), and its endpoints.
struct Parsed {
  size_t payload_offset = 0;
  size_t payload_len = 0;
  IpAddr src, dst;
  uint16_t src_port_be = 0, dst_port_be = 0;
};
// Parses the headers of a frame of `len` bytes whose first `head` bytes are at
// `frame` (a multi-buffer frame's first buffer holds all its headers). False for a
// frame that is not a plain IPv4/IPv6 UDP datagram or whose lengths disagree — the
// XDP program passes those to the kernel, so false means corruption.
bool ParseFrame(const uint8_t* frame, size_t head, size_t len, Parsed* out);

}  // namespace xdp
}  // namespace netreduce
