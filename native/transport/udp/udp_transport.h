// Transport over one kernel UDP socket: sendmmsg/recvmmsg batches, large socket
// buffers, DF set (IP_PMTUDISC_DO, which also makes Linux send IPv4 ID 0 on
// unconnected sockets, as the ICRC assumes; IPV6_PMTUDISC_DO: no fragmentation),
// IP_PKTINFO / IPV6_PKTINFO to learn and choose the local address when bound to the
// wildcard. The socket's family follows the address it binds (sockaddr.h): an IPv4
// address gets AF_INET, an IPv6 one AF_INET6, and "::" a dual-stack AF_INET6 socket
// that serves IPv4 and IPv6 peers alike.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>

#include "transport/transport.h"
#include "transport/udp/gso_runs.h"
#include "transport/udp/sockaddr.h"

namespace netreduce {

struct UdpOptions {
  std::string host = "0.0.0.0";  // local address to bind: IPv4, IPv6 ("::" = both) or a name
  uint16_t port = 0;             // 0 = ephemeral
  // A UDP socket already bound (a rank's data socket, bound before it registered its
  // address): taken over, host and port ignored, the options below set on it. Closed
  // by the transport, or by Open when it fails.
  int fd = -1;
  int rcvbuf_bytes = 32 << 20;
  int sndbuf_bytes = 8 << 20;
  // Receive a multicast group: bind to (group, port) with SO_REUSEADDR, so that every
  // rank on a host can, and join the group on the interface holding `group_iface`.
  // IPv4 groups only (the aggregator's --multicast-base is an IPv4 prefix).
  std::string join_group;
  std::string group_iface;
  int multicast_ttl = 1;  // for multicast this socket sends (IP_MULTICAST_TTL)
  // Kernel offloads to try (make_transport.h decides; each falls back to the plain
  // path, with the reason in Describe(), where the kernel refuses it):
  //  - gso: send each batch's runs of segmentable packets to one destination as one
  //    UDP_SEGMENT send (OutPacket::segmentable; gso_batch.h);
  //  - gro: UDP_GRO, receive coalesced runs of datagrams (up to 64 KiB per receive)
  //    and split them by the segment size the kernel reports.
  bool gso = false;
  bool gro = false;
  // With gro: bytes one RecvBatch takes in at most (the aggregator sets its own,
  // aggregator.cc kBatchBytes, so that the kernel's copy and the reduction that reads
  // it back meet in L2).
  size_t recv_batch_bytes = 512 * 1024;
};

// Room for one IP_PKTINFO and one IPV6_PKTINFO (a dual-stack socket may deliver both
// for an IPv4 datagram) and a UDP_SEGMENT / UDP_GRO value.
constexpr size_t kCmsgSpace = CMSG_SPACE(sizeof(in_pktinfo)) + CMSG_SPACE(sizeof(in6_pktinfo)) +
                              CMSG_SPACE(sizeof(int));

// GRO receive memory (udp_recv.cc): 64 buffers of 64 KiB, each 65 cache lines
// further on than a multiple of 64 KiB so that their first bytes do not all fall into
// the same cache sets.
constexpr size_t kGroBufBytes = 65536;
constexpr size_t kGroStride = kGroBufBytes + 65 * 64;
constexpr size_t kGroSlots = 64;
constexpr size_t kGroMemBytes = kGroSlots * kGroStride;

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
  Status PrepareWait(bool* ready) override {
    *ready = pending_next_ < pending_.size();  // segments of a coalesced receive wait
    return Status::Ok();
  }
  bool OwnsReceiveBuffers() const override { return gro_; }
  size_t ReceiveBufferBytes() const override { return rcvbuf_; }
  bool SendsUdpChecksum() const override { return true; }  // the kernel's (no SO_NO_CHECK)
  std::string Describe() const override;
  bool gso() const { return gso_; }
  bool gro() const { return gro_; }

 private:
  UdpTransport(int fd, int family, Endpoint local) : fd_(fd), family_(family), local_(local) {}
  void Reserve(size_t count);
  // One sendmmsg of `count` messages (msgs_[0..count)), retried while the socket is
  // full; *sent = messages taken, *err = errno of a failed message at *sent (0: none).
  void SendMessages(size_t count, size_t* sent, int* err);
  Status SendPlain(OutPacket* pkts, size_t n);
  Status SendSegmented(OutPacket* pkts, size_t n);
  Status RecvCoalesced(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got);
  size_t TakePending(InPacket* pkts, size_t max);
  Status SendError(int err, const OutPacket& p, size_t bytes) const;
  int fd_;
  int family_;  // AF_INET or AF_INET6
  size_t rcvbuf_ = 0;  // SO_RCVBUF read back after Open set it
  Endpoint local_;
  // Only the thread that sends turns gso_ off (a device that cannot segment); notes
  // are read by Describe() from any thread.
  std::atomic<bool> gso_{false};
  bool gro_ = false;
  mutable std::mutex note_mu_;
  std::string gso_note_;  // why GSO is off, when it was asked for
  std::string gro_note_;
  size_t recv_batch_bytes_ = 512 * 1024;
  std::vector<mmsghdr> msgs_;
  std::vector<sockaddr_storage> addrs_;
  std::vector<char> cmsg_;
  std::vector<iovec> iovs_;
  // GSO: the batch's packets grouped into runs (gso_runs.h), their iovecs.
  GsoRuns gso_plan_;
  std::vector<iovec> run_iovs_;
  std::vector<uint8_t> run_joined_;  // small pieces of a run copied into one iovec
  // GRO: receive buffers the coalesced datagrams land in (64 KiB + a stagger each, so
  // that they do not all map to the same cache sets), and the segments of the last
  // receive that did not fit the caller's descriptors.
  uint8_t* gro_mem_ = nullptr;   // mmap'd on first use (udp_recv.cc)
  size_t gro_last_largest_ = 0;  // the largest receive of the previous call
  struct Segment {
    uint8_t* buf;
    size_t len;
    size_t msg;  // its receive, for the sender and local address
  };
  std::vector<Segment> pending_;
  size_t pending_next_ = 0;
  std::vector<InPacket> pending_meta_;  // per receive of the batch: from, local address
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
