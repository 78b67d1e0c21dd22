// Transport over one kernel UDP socket: sendmmsg/recvmmsg batches, large socket
// buffers, DF set (IP_PMTUDISC_DO, which also makes Linux send IPv4 ID 0 on
// unconnected sockets, as the ICRC assumes; IPV6_PMTUDISC_DO: no fragmentation),
// IP_PKTINFO / IPV6_PKTINFO to learn and choose the local address when bound to the
// wildcard. The socket's family follows the address it binds (sockaddr.h): an IPv4
// address gets AF_INET, an IPv6 one AF_INET6, and "::" a dual-stack AF_INET6 socket
// that serves IPv4 and IPv6 peers alike.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>

#include "transport/transport.h"
#include "transport/udp/sockaddr.h"

namespace netreduce {

struct UdpOptions {
  std::string host = "0.0.0.0";  // local address to bind: IPv4, IPv6 ("::" = both) or a name
  uint16_t port = 0;             // 0 = ephemeral
  int rcvbuf_bytes = 32 << 20;
  int sndbuf_bytes = 8 << 20;
  // Receive a multicast group: bind to (group, port) with SO_REUSEADDR, so that every
  // rank on a host can, and join the group on the interface holding `group_iface`.
  // IPv4 groups only (the aggregator's --multicast-base is an IPv4 prefix).
  std::string join_group;
  std::string group_iface;
  int multicast_ttl = 1;  // for multicast this socket sends (IP_MULTICAST_TTL)
};

class UdpTransport : public Transport {
 public:
  static Status Open(const UdpOptions& opts, std::unique_ptr<UdpTransport>* out);
  ~UdpTransport() override;

  Status SendBatch(OutPacket* pkts, size_t n) override;
  Status RecvBatch(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) override;
  Status PeekHeader(uint8_t* buf, size_t n, int64_t timeout_us, size_t* len,
                    Endpoint* from) override;
  Status RecvScatter(iovec* iov, int iovcnt, size_t* len) override;
  Endpoint local() const override { return local_; }
  int PollFd() const override { return fd_; }

 private:
  UdpTransport(int fd, int family, Endpoint local) : fd_(fd), family_(family), local_(local) {}
  void Reserve(size_t count);
  int fd_;
  int family_;  // AF_INET or AF_INET6
  Endpoint local_;
  std::vector<mmsghdr> msgs_;
  std::vector<sockaddr_storage> addrs_;
  std::vector<char> cmsg_;
  std::vector<iovec> iovs_;
};

// Resolves "host" (name or dotted quad) to a network-order IPv4 address; an IPv6
// address is an error that says so (multicast groups, verbs peers and the
// rack-to-spine uplink are IPv4).
Status ResolveIpv4(const std::string& host, uint32_t* ip);
// The local address the kernel would use to reach `peer` (a connected probe socket).
Status LocalAddressFor(const Endpoint& peer, IpAddr* ip);
// The same for an IPv4 peer, network order.
Status LocalAddressFor(const Endpoint& peer, uint32_t* ip);
// The path MTU toward `host` (name, IPv4 or IPv6 literal) as the kernel knows it now:
// IP_MTU / IPV6_MTU of a connected UDP probe socket with DF set, i.e. the route's
// MTU lowered by any ICMP "fragmentation needed" (ICMPv6 "packet too big") it has
// learnt. `ipv6` says which family the address resolved to (the IP header is 20 or
// 40 bytes); an IPv4-mapped address (::ffff:a.b.c.d) is IPv4.
Status PathMtu(const std::string& host, uint16_t port, int* mtu, bool* ipv6);

}  // namespace netreduce
