// One AF_XDP socket bound to one receive/transmit queue of a device, with its own
// UMEM (libxdp's xsk API): 4 KiB frames, the first half lent to the kernel for
// receiving (the fill ring), the second half ours for building frames to send. A
// frame longer than one UMEM frame (MTU 9000) spans several, marked XDP_PKT_CONTD,
// where the kernel takes multi-buffer sockets (XDP_USE_SG, Linux 6.6); elsewhere the
// XDP program passes such frames to the kernel and this side sends them by socket.
//
// Copy mode on drivers without AF_XDP support (veth: the kernel copies each frame
// between its buffers and the UMEM), zero-copy where the driver has it (the NIC DMAs
// straight into the UMEM). Single-threaded: the data thread that owns the queue.
#pragma once

#include <xdp/xsk.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/xdp/counter.h"

namespace netreduce {
namespace xdp {

#ifndef XDP_USE_SG
#define XDP_USE_SG (1 << 4)  // linux/if_xdp.h of Linux >= 6.6
#endif
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
#endif

struct XskOptions {
  std::string ifname;
  uint32_t queue = 0;
  uint32_t ring = 4096;  // descriptors in each of the four rings (a power of two)
  bool try_zero_copy = true;
  bool try_multi_buffer = true;
  // Bytes the kernel leaves free before each received frame (UMEM frame headroom),
  // chosen by the transport so that the datagrams its caller reads sit aligned.
  uint32_t rx_headroom = 0;
};

class XskSocket {
 public:
  static constexpr uint32_t kFrameBytes = 4096;
  static Status Open(const XskOptions& opts, std::unique_ptr<XskSocket>* out);
  ~XskSocket();
  XskSocket(const XskSocket&) = delete;
  XskSocket& operator=(const XskSocket&) = delete;

  int fd() const { return fd_; }
  uint32_t queue() const { return queue_; }
  bool zero_copy() const { return zero_copy_; }
  bool multi_buffer() const { return multi_buffer_; }
  // The longest frame one receive buffer holds: the kernel keeps XDP_PACKET_HEADROOM
  // (256) and our headroom before it.
  uint32_t rx_frame_room() const { return kFrameBytes - 256 - rx_headroom_; }
  uint8_t* data(uint64_t addr) { return static_cast<uint8_t*>(xsk_umem__get_data(area_, addr)); }

  // Receive: peek up to `max` descriptors (one packet may take several), release
  // `n` of them once read, and give their frames back to the kernel.
  uint32_t RxPeek(uint32_t max, uint32_t* idx) { return xsk_ring_cons__peek(&rx_, max, idx); }
  const xdp_desc* RxDesc(uint32_t idx) const { return xsk_ring_cons__rx_desc(&rx_, idx); }
  void RxCancel(uint32_t n) { xsk_ring_cons__cancel(&rx_, n); }
  void RxRelease(uint32_t n) { xsk_ring_cons__release(&rx_, n); }
  void Recycle(uint64_t addr) { recycle_.push_back(addr); }
  void Refill();  // the recycled frames into the fill ring

  // Transmit: a free frame (false: none, even after reclaiming completions), a
  // descriptor for it (`more`: the packet continues in the next), then Kick() to
  // have the kernel send what is queued. Kick(true) waits until the ring drained.
  bool TakeFrame(uint64_t* addr);
  uint32_t free_frames() { Reclaim(); return uint32_t(free_.size()); }
  bool Queue(uint64_t addr, uint32_t len, bool more);
  Status Kick(bool drain, uint64_t* dropped);
  uint32_t tx_pending();

  uint64_t kicks() const { return kicks_; }              // sendto() calls made
  uint64_t kicks_again() const { return kicks_again_; }  // ... answered EAGAIN (more to do)
  // XDP_STATISTICS: the kernel's drops on this socket.
  void Statistics(uint64_t* rx_dropped, uint64_t* rx_ring_full, uint64_t* fill_empty,
                  uint64_t* tx_invalid) const;

 private:
  XskSocket() = default;
  void Reclaim();
  std::string ifname_;
  uint32_t queue_ = 0;
  uint32_t ring_ = 0;
  uint32_t rx_headroom_ = 0;
  void* area_ = nullptr;
  size_t area_bytes_ = 0;
  xsk_umem* umem_ = nullptr;
  xsk_socket* xsk_ = nullptr;
  xsk_ring_prod fill_{};
  xsk_ring_cons comp_{};
  xsk_ring_cons rx_{};
  xsk_ring_prod tx_{};
  int fd_ = -1;
  bool zero_copy_ = false;
  bool multi_buffer_ = false;
  Count kicks_, kicks_again_;
  std::vector<uint64_t> free_;     // TX frames not in flight
  std::vector<uint64_t> recycle_;  // RX frames read, not yet back in the fill ring
};

}  // namespace xdp
}  // namespace netreduce
