#include "transport/xdp/xsk_socket.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef SOL_XDP
#define SOL_XDP 283
#endif
#ifndef XDP_MAX_TX_SKB_BUDGET
#define XDP_MAX_TX_SKB_BUDGET 9  // Linux >= 6.17: descriptors one sendto() sends in copy mode
#endif

namespace netreduce {
namespace xdp {

Status XskSocket::Open(const XskOptions& opts, std::unique_ptr<XskSocket>* out) {
  std::unique_ptr<XskSocket> s(new XskSocket());
  s->ifname_ = opts.ifname;
  s->queue_ = opts.queue;
  s->ring_ = opts.ring;
  const uint32_t frames = 2 * opts.ring;  // ring for receiving, ring for sending
  s->area_bytes_ = size_t(frames) * kFrameBytes;
  void* area = mmap(nullptr, s->area_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                    -1, 0);
  if (area == MAP_FAILED) {
    return IoError("cannot map " + std::to_string(s->area_bytes_ >> 20) + " MiB of AF_XDP UMEM: " +
                   strerror(errno));
  }
  s->area_ = area;
  const std::string where = "queue " + std::to_string(opts.queue) + " of " + opts.ifname;
  xsk_umem_config ucfg{};
  ucfg.fill_size = opts.ring;
  ucfg.comp_size = opts.ring;
  ucfg.frame_size = kFrameBytes;
  ucfg.frame_headroom = opts.rx_headroom;
  s->rx_headroom_ = opts.rx_headroom;
  // Zero-copy where the driver can, copy mode elsewhere; multi-buffer frames where
  // the kernel has them. A refused bind leaves its rings configured on the UMEM's
  // socket, so each try starts from a fresh UMEM registration.
  std::string tried;
  int rc = 0;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const bool zc = attempt < 2;
    const bool sg = attempt % 2 == 0;
    if ((zc && !opts.try_zero_copy) || (sg && !opts.try_multi_buffer)) continue;
    rc = xsk_umem__create(&s->umem_, area, s->area_bytes_, &s->fill_, &s->comp_, &ucfg);
    if (rc != 0) {
      s->umem_ = nullptr;
      return IoError("cannot register the AF_XDP UMEM for " + where + ": " + strerror(-rc) +
                     (rc == -EPERM || rc == -ENOMEM
                          ? " (needs CAP_IPC_LOCK or a higher RLIMIT_MEMLOCK)" : ""));
    }
    xsk_socket_config xcfg{};
    xcfg.rx_size = opts.ring;
    xcfg.tx_size = opts.ring;
    xcfg.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD;  // xdp_program.cc attaches ours
    xcfg.bind_flags = uint16_t((zc ? XDP_ZEROCOPY : XDP_COPY) | XDP_USE_NEED_WAKEUP |
                               (sg ? XDP_USE_SG : 0));
    rc = xsk_socket__create(&s->xsk_, opts.ifname.c_str(), opts.queue, s->umem_, &s->rx_, &s->tx_,
                            &xcfg);
    if (rc == 0) {
      s->zero_copy_ = zc;
      s->multi_buffer_ = sg;
      break;
    }
    s->xsk_ = nullptr;
    xsk_umem__delete(s->umem_);
    s->umem_ = nullptr;
    tried += std::string(tried.empty() ? "" : ", ") + (zc ? "zero-copy" : "copy") +
             (sg ? "+multi-buffer" : "") + ": " + strerror(-rc);
    if (rc == -EPERM) break;
  }
  if (s->xsk_ == nullptr) {
    return Status(Code::kRefused, "cannot bind an AF_XDP socket to " + where + " (" + tried + ")" +
                                      (rc == -EPERM ? "; AF_XDP sockets need CAP_NET_RAW" : ""));
  }
  s->fd_ = xsk_socket__fd(s->xsk_);
  // Copy mode sends at most 32 frames per sendto() unless told more (Linux 6.17).
  unsigned budget = opts.ring;
  setsockopt(s->fd_, SOL_XDP, XDP_MAX_TX_SKB_BUDGET, &budget, sizeof(budget));
  // Copy mode builds an skb per frame, charged to this socket's send buffer until the
  // receiver frees it (a veth peer holds it until the rank has read it): the default
  // ~200 KiB would stall sending after a few dozen jumbo frames. A whole ring of them
  // (SO_SNDBUFFORCE with CAP_NET_ADMIN, else as much as wmem_max allows).
  int sndbuf = int(opts.ring) * int(2 * kFrameBytes + 1024);
  if (setsockopt(s->fd_, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof(sndbuf)) != 0) {
    setsockopt(s->fd_, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  }
  for (uint32_t f = 0; f < opts.ring; ++f) s->recycle_.push_back(uint64_t(f) * kFrameBytes);
  s->Refill();
  for (uint32_t f = opts.ring; f < frames; ++f) s->free_.push_back(uint64_t(f) * kFrameBytes);
  *out = std::move(s);
  return Status::Ok();
}

XskSocket::~XskSocket() {
  if (xsk_ != nullptr) xsk_socket__delete(xsk_);
  if (umem_ != nullptr) xsk_umem__delete(umem_);
  if (area_ != nullptr) munmap(area_, area_bytes_);
}

void XskSocket::Refill() {
  if (recycle_.empty()) return;
  uint32_t idx = 0;
  const uint32_t n = xsk_ring_prod__reserve(&fill_, uint32_t(recycle_.size()), &idx);
  // The fill ring has room for every receive frame, so it never refuses: frames are
  // either in it, in the receive ring, or here.
  for (uint32_t i = 0; i < n; ++i) {
    *xsk_ring_prod__fill_addr(&fill_, idx + i) = recycle_[recycle_.size() - n + i];
  }
  xsk_ring_prod__submit(&fill_, n);
  recycle_.resize(recycle_.size() - n);
}

void XskSocket::Reclaim() {
  uint32_t idx = 0;
  const uint32_t n = xsk_ring_cons__peek(&comp_, ring_, &idx);
  for (uint32_t i = 0; i < n; ++i) free_.push_back(*xsk_ring_cons__comp_addr(&comp_, idx + i));
  if (n) xsk_ring_cons__release(&comp_, n);
}

bool XskSocket::TakeFrame(uint64_t* addr) {
  if (free_.empty()) Reclaim();
  if (free_.empty()) return false;
  *addr = free_.back();
  free_.pop_back();
  return true;
}

bool XskSocket::Queue(uint64_t addr, uint32_t len, bool more) {
  uint32_t idx = 0;
  if (xsk_ring_prod__reserve(&tx_, 1, &idx) != 1) return false;
  xdp_desc* d = xsk_ring_prod__tx_desc(&tx_, idx);
  d->addr = addr;
  d->len = len;
  d->options = more ? XDP_PKT_CONTD : 0;
  xsk_ring_prod__submit(&tx_, 1);
  return true;
}

uint32_t XskSocket::tx_pending() { return ring_ - xsk_prod_nb_free(&tx_, ring_); }

Status XskSocket::Kick(bool drain, uint64_t* dropped) {
  // In copy mode sendto() is where the kernel sends: up to its budget of frames per
  // call, -EAGAIN when more wait (or the completion ring is full: reclaim, retry).
  for (int spins = 0;; ++spins) {
    const bool any = tx_pending() > 0;
    if (any && (zero_copy_ ? xsk_ring_prod__needs_wakeup(&tx_) : true)) {
      ++kicks_;
      if (sendto(fd_, nullptr, 0, MSG_DONTWAIT, nullptr, 0) < 0) {
        if (errno == EAGAIN) ++kicks_again_;
        if (errno == EBUSY) {
          ++*dropped;  // the device dropped a frame (full queue): lost, like any other
        } else if (errno != EAGAIN && errno != ENOBUFS && errno != EINTR) {
          return IoError("AF_XDP send on queue " + std::to_string(queue_) + " of " + ifname_ +
                         ": " + strerror(errno));
        }
      }
    }
    Reclaim();
    if (!drain || tx_pending() == 0) return Status::Ok();
    if (spins > 64) {  // the device is backed up: wait for room as a blocking send would
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, 1);
    }
    if (spins > 64 + 2000) {  // ~2 s without the kernel taking a frame
      return IoError("AF_XDP queue " + std::to_string(queue_) + " of " + ifname_ +
                     " sends nothing (device down or without that transmit queue)");
    }
  }
}

void XskSocket::Statistics(uint64_t* rx_dropped, uint64_t* rx_ring_full, uint64_t* fill_empty,
                           uint64_t* tx_invalid) const {
  xdp_statistics st{};
  socklen_t len = sizeof(st);
  if (getsockopt(fd_, SOL_XDP, XDP_STATISTICS, &st, &len) != 0) return;
  *rx_dropped = st.rx_dropped;
  *tx_invalid = st.tx_invalid_descs;
  if (len >= sizeof(st)) {
    *rx_ring_full = st.rx_ring_full;
    *fill_empty = st.rx_fill_ring_empty_descs;
  }
}

}  // namespace xdp
}  // namespace netreduce
