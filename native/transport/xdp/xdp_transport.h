// Transport over an AF_XDP socket on one queue of a device, beside a kernel UDP
// socket on the same port (transport/udp).
//
// The XDP program (xdp_program.h) hands this queue's frames for this port straight
// to the socket's UMEM, so a datagram costs no trip through the IP and UDP stack and
// a batch of them no system call; everything it passes — a frame that landed on
// another queue, a fragment, IP options — reaches the kernel socket, which this
// transport reads too. Sending builds the frame's Ethernet, IP and UDP headers here
// (frame.h), the next hop's MAC from the kernel's neighbour table (netlink.h). A
// datagram whose next hop the kernel has not resolved, that leaves by another
// device, or that exceeds the device's MTU goes through the kernel socket instead:
// the kernel resolves the neighbour (ARP / ND) meanwhile, routes it, or reports the
// MTU error the socket transport reports. The kernel socket also holds the port, so
// nothing else binds it and no ICMP port-unreachable answers the steered datagrams.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"
#include "transport/udp/udp_transport.h"
#include "transport/xdp/counter.h"
#include "transport/xdp/netlink.h"
#include "transport/xdp/xdp_program.h"
#include "transport/xdp/xsk_socket.h"

namespace netreduce {

struct XdpOptions {
  UdpOptions udp;                             // the kernel socket: address, port, buffers
  std::shared_ptr<xdp::XdpProgram> program;   // attached to the device
  uint32_t queue = 0;                         // the queue whose frames this transport takes
  bool try_zero_copy = true;
  // Lay received IPv4 frames out so that byte `rx_align_offset` of their UDP payload
  // falls on a 64-byte boundary (the aggregator: its RoCE payload, 32 bytes in).
  uint32_t rx_align_offset = 0;
};

class XdpTransport : public Transport {
 public:
  // Fails (the caller falls back to UdpTransport, saying why) when the queue does
  // not exist or no AF_XDP socket can be bound to it.
  static Status Open(const XdpOptions& opts, std::unique_ptr<XdpTransport>* out);
  ~XdpTransport() override;

  Status SendBatch(OutPacket* pkts, size_t n) override;
  Status RecvBatch(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) override;
  Status PeekHeader(uint8_t* buf, size_t n, int64_t timeout_us, size_t* len,
                    Endpoint* from) override;
  Status RecvScatter(iovec* iov, int iovcnt, size_t* len) override;
  Endpoint local() const override { return udp_->local(); }
  int PollFd() const override { return epoll_fd_; }
  // Received datagrams are read where they lie: a one-buffer frame in the UMEM, where
  // the kernel wrote it (its buffer returns to the kernel at the next receive), a
  // longer one, or one the kernel socket took, in this transport's scratch memory.
  bool OwnsReceiveBuffers() const override { return true; }

  // "AF_XDP native copy mode on queue 0 of eth0" (what carries this port's traffic).
  std::string Describe() const override;
  bool SendsUdpChecksum() const override { return true; }  // xdp::StoreUdpChecksum
  // Packets by path: rx_xsk (rx_lent of them read in place), rx_kernel,
  // tx_xsk, tx_kernel_* by reason, and the
  // kernel's AF_XDP drop counters for this socket.
  std::map<std::string, uint64_t> Stats() const;
  const xdp::XskSocket& socket() const { return *xsk_; }

 private:
  XdpTransport() = default;
  // One received packet's descriptors [first, first + count) of the receive ring.
  struct RxPacket {
    uint32_t first = 0, count = 0;
    size_t len = 0;  // frame bytes over all its descriptors
  };
  // The next whole packet among `avail` peeked descriptors from `idx`; false when the
  // peeked run ends inside a packet (its rest is not in the ring yet).
  bool NextPacket(uint32_t idx, uint32_t avail, RxPacket* p) const;
  // Points `pkt` at packet `p`'s datagram (in place, or copied into scratch); false
  // when it is malformed (dropped), or when scratch has no room (*full: left in the ring).
  bool Deliver(const RxPacket& p, InPacket* pkt, bool* full);
  // `bytes` of scratch whose byte align_offset_ lies on 64 bytes; nullptr when full.
  uint8_t* Scratch(size_t bytes);
  size_t CopyPayload(const RxPacket& p, size_t payload_offset, size_t skip, uint8_t* dst, size_t n);
  void RecycleFrames(const RxPacket& p);
  void ReturnLent();  // frames lent by the previous receive, back to the kernel
  Status SendXsk(const OutPacket& p, const xdp::NextHop& hop, size_t bytes, bool* sent);
  Status WaitBoth(int64_t timeout_us);

  std::unique_ptr<UdpTransport> udp_;
  std::unique_ptr<xdp::XskSocket> xsk_;
  std::shared_ptr<xdp::XdpProgram> program_;
  std::unique_ptr<xdp::NeighbourCache> neighbours_;
  xdp::Interface dev_;
  int epoll_fd_ = -1;
  uint32_t polls_since_kernel_ = 0;
  std::vector<uint64_t> lent_;     // UMEM frames the caller reads now
  std::vector<uint8_t> scratch_;   // multi-buffer frames and the kernel socket's datagrams
  size_t scratch_used_ = 0;        // bytes of scratch_ the current receive handed out
  uint32_t align_offset_ = 0;      // XdpOptions::rx_align_offset
  std::vector<OutPacket> via_kernel_;
  // A packet PeekHeader looked at and RecvScatter will take: from the ring, or (when
  // `held_kernel_`) the kernel socket's next datagram.
  bool held_ = false, held_kernel_ = false;
  RxPacket held_packet_;
  xdp::Parsed held_parsed_;
  struct {
    xdp::Count rx_xsk, rx_kernel, rx_malformed, rx_lent, tx_xsk, tx_dropped;
    xdp::Count tx_kernel_unresolved, tx_kernel_stale, tx_kernel_elsewhere;
    xdp::Count tx_kernel_oversize, tx_kernel_family;
  } n_;
  Status Kick();  // sends what is queued, counting the device's drops
};

// The data threads' transports on one device: one program, and one XdpTransport per
// queue 0..count-1 for ports port..port+count-1 (thread t: queue t, port + t).
// Where a thread's queue cannot take an AF_XDP socket its transport is the plain
// socket, and `notes` says so; an error only when the program cannot attach at all.
struct XdpSetup {
  UdpOptions udp;           // host and first port; port + t for thread t
  std::string device;       // empty: the device holding udp.host
  uint32_t count = 1;       // threads (queues, ports)
  xdp::AttachMode mode = xdp::AttachMode::kAuto;
  bool try_zero_copy = true;
  uint32_t rx_align_offset = 0;  // XdpOptions::rx_align_offset
};
Status OpenXdpTransports(const XdpSetup& setup, std::vector<std::unique_ptr<Transport>>* out,
                         std::shared_ptr<xdp::XdpProgram>* program, std::vector<std::string>* notes);

}  // namespace netreduce
