#include "transport/xdp/frame.h"

#include <arpa/inet.h>

#include <cstring>

namespace netreduce {
namespace xdp {
namespace {

inline void Put16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v >> 8); p[1] = uint8_t(v); }
inline uint16_t Get16(const uint8_t* p) { return uint16_t((p[0] << 8) | p[1]); }

// The ones'-complement sum of `n` bytes taken as big-endian 16-bit words from an even
// offset, folded to 16 bits. Summing native 32-bit words into 64 bits and folding at
// the end gives the same sum byte-swapped on a little-endian machine (RFC 1071's byte
// order independence), and the loop vectorizes.
template <bool kCopy>
inline uint16_t Fold16(uint8_t* dst, const uint8_t* p, size_t n) {
  uint64_t s = 0;
  for (; n >= 4; n -= 4, p += 4, dst += 4) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    if (kCopy) std::memcpy(dst, &v, 4);
    s += v;
  }
  if (kCopy) std::memcpy(dst, p, n);
  if (n >= 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    s += v;
    p += 2;
    n -= 2;
  }
  if (n) {  // the last byte is the high byte of a big-endian word padded with zero
    uint16_t v = 0;
    std::memcpy(&v, p, 1);
    s += v;
  }
  s = (s & 0xFFFFFFFFu) + (s >> 32);
  s = (s & 0xFFFFFFFFu) + (s >> 32);
  s = (s & 0xFFFF) + (s >> 16);
  s = (s & 0xFFFF) + (s >> 16);
  s = (s & 0xFFFF) + (s >> 16);
  return ntohs(uint16_t(s));  // native order -> the big-endian words' sum
}

uint32_t Fold(uint32_t acc) {
  while (acc >> 16) acc = (acc & 0xFFFF) + (acc >> 16);
  return acc;
}

}  // namespace

Mac MulticastMac(const IpAddr& group) {
  Mac m;
  if (group.is_v4()) {
    m.b[0] = 0x01; m.b[1] = 0x00; m.b[2] = 0x5E;
    m.b[3] = group.bytes[13] & 0x7F; m.b[4] = group.bytes[14]; m.b[5] = group.bytes[15];
  } else {
    m.b[0] = 0x33; m.b[1] = 0x33;
    std::memcpy(m.b + 2, group.bytes + 12, 4);
  }
  return m;
}

uint32_t ChecksumAdd(uint32_t acc, const uint8_t* p, size_t n, bool* odd) {
  if (n == 0) return acc;
  uint32_t piece = Fold16<false>(nullptr, p, n);
  if (*odd) piece = ((piece & 0xFF) << 8) | (piece >> 8);  // its words straddle ours
  *odd ^= (n & 1) != 0;
  return Fold(acc + piece);
}

uint32_t ChecksumCopy(uint32_t acc, uint8_t* dst, const uint8_t* p, size_t n, bool* odd) {
  if (n == 0) return acc;
  uint32_t piece = Fold16<true>(dst, p, n);
  if (*odd) piece = ((piece & 0xFF) << 8) | (piece >> 8);  // its words straddle ours
  *odd ^= (n & 1) != 0;
  return Fold(acc + piece);
}

uint16_t ChecksumFinish(uint32_t acc) { return htons(uint16_t(~Fold(acc))); }

uint32_t WriteHeaders(uint8_t* out, const Mac& src_mac, const Mac& dst_mac, const IpAddr& src,
                      uint16_t src_port_be, const IpAddr& dst, uint16_t dst_port_be,
                      size_t udp_payload) {
  const bool v6 = !dst.is_v4();
  const size_t udp_len = kUdpBytes + udp_payload;
  std::memcpy(out, dst_mac.b, 6);
  std::memcpy(out + 6, src_mac.b, 6);
  Put16(out + 12, v6 ? 0x86DD : 0x0800);
  uint8_t* ip = out + kEthBytes;
  uint8_t pseudo[40];
  size_t pseudo_len;
  uint8_t* udp;
  if (!v6) {
    ip[0] = 0x45;  // version 4, IHL 5 (no options)
    ip[1] = 0;     // TOS
    Put16(ip + 2, uint16_t(kIp4Bytes + udp_len));
    Put16(ip + 4, 0);       // ID 0, as the ICRC assumes (wire/roce.h)
    Put16(ip + 6, 0x4000);  // DF, offset 0
    ip[8] = kHopLimit;
    ip[9] = 17;  // UDP
    Put16(ip + 10, 0);
    std::memcpy(ip + 12, src.bytes + 12, 4);
    std::memcpy(ip + 16, dst.bytes + 12, 4);
    bool odd = false;
    const uint16_t ip_sum = ChecksumFinish(ChecksumAdd(0, ip, kIp4Bytes, &odd));
    std::memcpy(ip + 10, &ip_sum, 2);
    std::memcpy(pseudo, ip + 12, 8);
    pseudo[8] = 0;
    pseudo[9] = 17;
    Put16(pseudo + 10, uint16_t(udp_len));
    pseudo_len = 12;
    udp = ip + kIp4Bytes;
  } else {
    Put16(ip, 0x6000);  // version 6, traffic class 0, flow label 0
    Put16(ip + 2, 0);
    Put16(ip + 4, uint16_t(udp_len));
    ip[6] = 17;  // next header: UDP
    ip[7] = kHopLimit;
    std::memcpy(ip + 8, src.bytes, 16);
    std::memcpy(ip + 24, dst.bytes, 16);
    std::memcpy(pseudo, ip + 8, 32);
    Put16(pseudo + 32, 0);
    Put16(pseudo + 34, uint16_t(udp_len));
    Put16(pseudo + 36, 0);
    Put16(pseudo + 38, 17);
    pseudo_len = 40;
    udp = ip + kIp6Bytes;
  }
  std::memcpy(udp, &src_port_be, 2);
  std::memcpy(udp + 2, &dst_port_be, 2);
  Put16(udp + 4, uint16_t(udp_len));
  Put16(udp + 6, 0);
  bool odd = false;
  uint32_t acc = ChecksumAdd(0, pseudo, pseudo_len, &odd);
  return ChecksumAdd(acc, udp, kUdpBytes, &odd);
}

void StoreUdpChecksum(uint8_t* headers, bool v6, uint32_t acc) {
  uint16_t sum = ChecksumFinish(acc);
  if (sum == 0) sum = 0xFFFF;
  std::memcpy(headers + kEthBytes + (v6 ? kIp6Bytes : kIp4Bytes) + 6, &sum, 2);
}

bool ParseFrame(const uint8_t* frame, size_t head, size_t len, Parsed* out) {
  if (head < kEthBytes || head > len) return false;
  const uint16_t type = Get16(frame + 12);
  const uint8_t* ip = frame + kEthBytes;
  const uint8_t* udp;
  size_t room;  // bytes the IP header says follow it
  if (type == 0x0800) {
    if (head < kEthBytes + kIp4Bytes + kUdpBytes) return false;
    if (ip[0] != 0x45 || ip[9] != 17) return false;
    const size_t total = Get16(ip + 2);
    if (total < kIp4Bytes + kUdpBytes || kEthBytes + total > len) return false;
    room = total - kIp4Bytes;
    uint32_t a;
    std::memcpy(&a, ip + 12, 4);
    out->src = IpAddr::V4(a);
    std::memcpy(&a, ip + 16, 4);
    out->dst = IpAddr::V4(a);
    udp = ip + kIp4Bytes;
  } else if (type == 0x86DD) {
    if (head < kEthBytes + kIp6Bytes + kUdpBytes) return false;
    if ((ip[0] >> 4) != 6 || ip[6] != 17) return false;
    room = Get16(ip + 4);
    if (room < kUdpBytes || kEthBytes + kIp6Bytes + room > len) return false;
    std::memcpy(out->src.bytes, ip + 8, 16);
    std::memcpy(out->dst.bytes, ip + 24, 16);
    udp = ip + kIp6Bytes;
  } else {
    return false;
  }
  const size_t udp_len = Get16(udp + 4);
  if (udp_len < kUdpBytes || udp_len > room) return false;
  std::memcpy(&out->src_port_be, udp, 2);
  std::memcpy(&out->dst_port_be, udp + 2, 2);
  out->payload_offset = size_t(udp + kUdpBytes - frame);
  out->payload_len = udp_len - kUdpBytes;
  return true;
}

}  // namespace xdp
}  // namespace netreduce
