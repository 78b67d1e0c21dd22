// What the AF_XDP transport asks the kernel about the network, since it writes its
// frames' Ethernet and IP headers itself: the device (index, MAC, MTU, queues), and
// per destination the route (which device, which next hop, which source address)
// and the next hop's MAC from the neighbour table (rtnetlink RTM_GETROUTE and
// RTM_GETNEIGH, one request each, as `ip route get` and `ip neigh get` send).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>

#include "common/ip_address.h"
#include "common/status.h"
#include "transport/xdp/counter.h"
#include "transport/xdp/frame.h"

namespace netreduce {
namespace xdp {

struct Interface {
  std::string name;
  int ifindex = 0;
  Mac mac;
  int mtu = 0;
  uint32_t rx_queues = 1;  // real_num_rx_queues (/sys/class/net/DEV/queues/rx-*)
  uint32_t tx_queues = 1;
  IpAddr ip4;  // the device's first IPv4 address (unspecified: none)
  IpAddr ip6;  // its first global IPv6 address (unspecified: none)
  bool loopback = false;
};

// The device called `name`, in this process's network namespace.
Status InterfaceByName(const std::string& name, Interface* out);
// The device holding the local address `ip` (getifaddrs). The wildcard (0.0.0.0,
// ::) names no device: the caller must be told one.
Status InterfaceForAddress(const IpAddr& ip, std::string* name);

// Where a frame to a destination goes, as the kernel's tables say now.
struct NextHop {
  enum Kind {
    kDirect,      // out of our device to `mac`
    kUnresolved,  // out of our device, but the next hop's MAC is not known (yet)
    kStale,       // MAC known, but the kernel has not confirmed it lately
    kElsewhere,   // another device, or a local address: only the kernel can send it
  };
  Kind kind = kElsewhere;
  Mac mac;
  IpAddr src;  // the route's preferred source address (unspecified: none given)
};

// A netlink socket and the two requests, for one device.
class Rtnetlink {
 public:
  explicit Rtnetlink(int ifindex) : ifindex_(ifindex) {}
  ~Rtnetlink();
  Rtnetlink(const Rtnetlink&) = delete;
  Rtnetlink& operator=(const Rtnetlink&) = delete;
  // Asks route and neighbour table about `dst`; an error only when netlink itself
  // fails (the transport then sends through the kernel).
  Status Resolve(const IpAddr& dst, NextHop* out);

 private:
  Status Open();
  Status Request(void* msg, size_t len, uint8_t* reply, size_t cap, size_t* got);
  int fd_ = -1;
  int ifindex_;
  uint32_t seq_ = 0;
};

// The next hops of the destinations a transport sends to, each asked again after a
// second (so a changed neighbour is followed within one); an unresolved one after
// 5 ms (the kernel is resolving it meanwhile, from the datagram sent through it).
class NeighbourCache {
 public:
  static constexpr int64_t kTtlUs = 1000000;
  static constexpr int64_t kUnresolvedTtlUs = 5000;
  explicit NeighbourCache(int ifindex) : nl_(ifindex) {}
  // The next hop toward `dst` at time `now_us`. kStale is reported once per refresh,
  // so that one datagram goes through the kernel and makes it confirm the neighbour;
  // until the next refresh the entry then reads kDirect.
  NextHop Lookup(const IpAddr& dst, int64_t now_us);
  uint64_t lookups() const { return lookups_; }

 private:
  struct Hash {
    size_t operator()(const IpAddr& a) const {
      uint64_t x, y;
      std::memcpy(&x, a.bytes, 8);
      std::memcpy(&y, a.bytes + 8, 8);
      return size_t((x ^ (y * 0x9E3779B97F4A7C15ull)) >> 7);
    }
  };
  struct Entry {
    NextHop hop;
    int64_t expires_us = 0;
  };
  Rtnetlink nl_;
  std::unordered_map<IpAddr, Entry, Hash> map_;
  Count lookups_;  // netlink round trips made
};

}  // namespace xdp
}  // namespace netreduce
