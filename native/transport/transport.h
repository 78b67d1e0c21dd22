// The seam between the data plane and the wire. The engine and the aggregator see
// only this interface; transport/udp/ implements it over kernel UDP sockets with
// sendmmsg/recvmmsg (and UDP GSO/GRO where the kernel has them), and transport/verbs/
// implements the same interface over an RDMA queue pair, RC by default or UC
// (NETREDUCE_VERBS_QP; RDMA WRITE with immediate), where the NIC builds the headers
// that the UDP transport's callers build by hand. Which one a data socket is, is
// chosen in one place: make_transport.h.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/ip_address.h"
#include "common/status.h"

namespace netreduce {

// An IPv4 or IPv6 endpoint, the port in network byte order. IPv4 lives in `ip`
// (network order), as everything written for IPv4 reads it; an IPv6 endpoint has
// v6 set, ip = 0 and its address in `ip6` (common/ip_address.h). address() is the
// one view of both that code serving either family uses; Of() builds either.
struct Endpoint {
  uint32_t ip = 0;
  uint16_t port = 0;
  IpAddr ip6;       // the IPv6 address, when v6
  bool v6 = false;  // an IPv6 endpoint ("::" included)

  static Endpoint Of(const IpAddr& a, uint16_t port_be) {
    Endpoint e;
    e.port = port_be;
    if (a.is_v4()) {
      e.ip = a.v4();
    } else {
      e.ip6 = a;
      e.v6 = true;
    }
    return e;
  }
  bool is_v6() const { return v6; }
  IpAddr address() const { return v6 ? ip6 : IpAddr::V4(ip); }
  bool operator==(const Endpoint& o) const {
    return ip == o.ip && port == o.port && v6 == o.v6 && ip6 == o.ip6;
  }
};
// "10.0.0.1:4791" or "[fd00::1]:4791".
inline std::string ToString(const Endpoint& e) { return ToString(e.address(), e.port); }

// One datagram to send, gathered from up to three pieces (header, payload, trailer).
struct OutPacket {
  Endpoint to;
  uint32_t from_ip = 0;  // IPv4 source address to use (network order); 0 = the kernel's choice
  IpAddr from_ip6;       // IPv6 source address to use, if set (it wins over from_ip)
  iovec iov[3];
  int iovcnt = 0;
  // A RoCEv2 datagram that may leave in one segmented send (UDP GSO) with the other
  // segmentable packets of its batch to the same destination and of the same length
  // (the last of them may be shorter); the kernel or the NIC cuts them apart again
  // into ordinary datagrams. Packets to one destination still leave in the order
  // given. Off by default: verbs packets and acknowledgements go one by one.
  bool segmentable = false;
  // The last 4 bytes (of iov[iovcnt - 1]) are the ICRC, computed for IPv4 ID 0. Segment
  // k of a GSO send carries IPv4 ID k, which the ICRC covers, so a transport that
  // segments rewrites those bytes in place for ID k (wire::IcrcIpIdDelta).
  bool icrc = false;
};

// One received datagram: the caller provides `buf`/`cap`; the transport fills the rest.
struct InPacket {
  uint8_t* buf = nullptr;
  size_t cap = 0;
  size_t len = 0;
  Endpoint from;
  uint32_t local_ip = 0;  // the IPv4 address the sender targeted (network order)
  IpAddr local_ip6;       // the IPv6 address the sender targeted, if it was IPv6
  // The targeted address of either family.
  IpAddr local_address() const { return local_ip6.unspecified() ? IpAddr::V4(local_ip) : local_ip6; }
  // The transport has already checked the packet's integrity (a verbs NIC checks the
  // ICRC before it completes a receive): the caller need not recompute it.
  bool verified = false;
  // A kernel UDP socket delivered it: had the sender set a UDP checksum (and said so,
  // wire::kExtUdpChecksum) that did not match, the kernel would have dropped it.
  // False where packets bypass the kernel's checks (AF_XDP).
  bool kernel_checked = false;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Sends all `n` packets (blocking while the socket buffer is full). Packets to the
  // same destination leave in the order given; across destinations the order may
  // change (a GSO send carries one destination's run).
  virtual Status SendBatch(OutPacket* pkts, size_t n) = 0;
  // Waits up to `timeout_us` for datagrams, then fills up to `max` of them. Into the
  // callers' buffers (buf, cap), unless OwnsReceiveBuffers(): then `buf` is repointed
  // at the transport's own memory (the segments of a coalesced UDP GRO receive lie
  // there one after another), valid until the next receive call. Either way callers
  // set buf and cap before every call.
  virtual Status RecvBatch(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) = 0;
  // RecvBatch fills packets from the transport's own memory: callers offer many
  // packet descriptors (one coalesced receive may hold 64 datagrams) and need no
  // buffers of their own. PeekHeader/RecvScatter cannot split a coalesced receive, so
  // such a transport is read with RecvBatch only.
  virtual bool OwnsReceiveBuffers() const { return false; }
  // What the kernel holds for this port's received datagrams before it drops them
  // (SO_RCVBUF as read back: its accounting, twice what was asked); 0 where packets
  // do not queue in a socket (AF_XDP rings).
  virtual size_t ReceiveBufferBytes() const { return 0; }
  // Zero-copy receive in two steps: look at the first `n` bytes of the next datagram
  // (waiting up to `timeout_us`), learning its full length and sender, then receive it
  // scattered straight into the caller's memory (header, destination, trailer).
  // PeekHeader returns with *len = 0 when nothing arrived.
  virtual Status PeekHeader(uint8_t* buf, size_t n, int64_t timeout_us, size_t* len,
                            Endpoint* from) = 0;
  virtual Status RecvScatter(iovec* iov, int iovcnt, size_t* len) = 0;
  virtual Endpoint local() const = 0;
  // A descriptor that polls readable when datagrams wait (the verbs transport
  // gives its completion channel's).
  virtual int PollFd() const = 0;
  // Called before waiting on PollFd(): *ready = something can be received now. A
  // verbs transport arms its completion channel here (and finds completions that
  // landed before the arm); a socket needs nothing.
  virtual Status PrepareWait(bool* ready) {
    *ready = false;
    return Status::Ok();
  }
  // The most chunks one message may have on this transport (verbs: 2^16, the chunk
  // field of its RETH.VA; docs/protocol.md "Verbs peers").
  virtual uint64_t MaxMessageChunks() const { return ~uint64_t(0); }
  // Whether every datagram this transport sends carries a UDP checksum (its kernel's,
  // its NIC's or its own): its senders then set wire::kExtUdpChecksum. Not a verbs
  // queue pair (a RoCE NIC sends UDP checksum 0).
  virtual bool SendsUdpChecksum() const { return false; }
  // Which packet path this transport takes, for logs and `netreduce info`, e.g.
  // "udp gso+gro" or "udp sendmmsg/recvmmsg (no GSO: ...)".
  virtual std::string Describe() const { return ""; }
};

// Waits up to `timeout_us` until any of `n` transports has something to read.
// `readable`, when given (n entries): whether each may hold something now -- false
// for one that polled empty, so that its caller need not try a receive (all true
// when a transport's PrepareWait found work without polling).
Status WaitReadable(Transport* const* transports, size_t n, int64_t timeout_us,
                    bool* readable = nullptr);

}  // namespace netreduce
