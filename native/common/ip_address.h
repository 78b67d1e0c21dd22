// An IP address of either family, as the data plane carries it: 16 bytes in network
// order, IPv4 held as the IPv4-mapped IPv6 address ::ffff:a.b.c.d (RFC 4291 2.5.5.2),
// which is also how a dual-stack AF_INET6 socket names IPv4 peers. One type lets the
// rank address table, the ICRC and the transports treat both families alike; the
// family shows only where it must: the socket, the IP header the ICRC covers (20 or
// 40 bytes) and the text form ("10.0.0.1", "fd00::1", "[fd00::1]:4791").
#pragma once

#include <arpa/inet.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace netreduce {

struct IpAddr {
  uint8_t bytes[16] = {};  // network order; all zero = "::" (the IPv6 wildcard)

  // From a network-order IPv4 address (the v4-mapped form).
  static IpAddr V4(uint32_t ip_be) {
    IpAddr a;
    a.bytes[10] = 0xFF;
    a.bytes[11] = 0xFF;
    std::memcpy(a.bytes + 12, &ip_be, 4);
    return a;
  }
  static IpAddr V6(const in6_addr& in) {
    IpAddr a;
    std::memcpy(a.bytes, &in, 16);
    return a;
  }
  bool is_v4() const {
    static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    return std::memcmp(bytes, kPrefix, 12) == 0;
  }
  // The IPv4 address, network order; meaningful when is_v4().
  uint32_t v4() const {
    uint32_t ip;
    std::memcpy(&ip, bytes + 12, 4);
    return ip;
  }
  // "::" or "0.0.0.0": no address chosen (bind to all, or let the kernel pick).
  bool unspecified() const {
    static const uint8_t kZero[16] = {};
    return std::memcmp(bytes, kZero, 16) == 0 || (is_v4() && v4() == 0);
  }
  bool is_multicast() const { return is_v4() ? (bytes[12] & 0xF0) == 0xE0 : bytes[0] == 0xFF; }
  bool operator==(const IpAddr& o) const { return std::memcmp(bytes, o.bytes, 16) == 0; }
  bool operator!=(const IpAddr& o) const { return !(*this == o); }
};

// "10.0.0.1" for IPv4 (mapped or not), "fd00::1" for IPv6.
inline std::string ToString(const IpAddr& a) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.is_v4()) {
    in_addr v4;
    v4.s_addr = a.v4();
    inet_ntop(AF_INET, &v4, buf, sizeof(buf));
  } else {
    inet_ntop(AF_INET6, a.bytes, buf, sizeof(buf));
  }
  return buf;
}

// "10.0.0.1:4791" or "[fd00::1]:4791", as the control plane writes addresses;
// `port_be` in network order.
inline std::string ToString(const IpAddr& a, uint16_t port_be) {
  const std::string host = ToString(a);
  const std::string port = std::to_string(ntohs(port_be));
  return a.is_v4() ? host + ":" + port : "[" + host + "]:" + port;
}

}  // namespace netreduce
