#include "transport/xdp/xdp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "transport/udp/sockaddr.h"

namespace netreduce {
namespace {

int64_t NowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

constexpr uint32_t kMaxDescsPerPacket = 17;  // MAX_SKB_FRAGS + 1

}  // namespace

Status XdpTransport::Open(const XdpOptions& o, std::unique_ptr<XdpTransport>* out) {
  std::unique_ptr<XdpTransport> t(new XdpTransport());
  t->program_ = o.program;
  t->dev_ = o.program->device();
  if (o.queue >= t->dev_.rx_queues || o.queue >= t->dev_.tx_queues) {
    return Status(Code::kRefused,
                  "device " + t->dev_.name + " has " + std::to_string(t->dev_.rx_queues) +
                      " receive and " + std::to_string(t->dev_.tx_queues) + " transmit queues, "
                      "so no queue " + std::to_string(o.queue) + " for data port " +
                      std::to_string(o.udp.port));
  }
  NR_RETURN_IF_ERROR(UdpTransport::Open(o.udp, &t->udp_));
  xdp::XskOptions xo;
  xo.ifname = t->dev_.name;
  xo.queue = o.queue;
  xo.try_zero_copy = o.try_zero_copy;
  // Received data starts XDP_PACKET_HEADROOM (256) + headroom into its frame: pick the
  // headroom that puts an IPv4 datagram's byte rx_align_offset on 64 bytes.
  const uint32_t at = 256 + uint32_t(xdp::HeaderBytes(false)) + o.rx_align_offset;
  xo.rx_headroom = (64 - at % 64) % 64;
  NR_RETURN_IF_ERROR(xdp::XskSocket::Open(xo, &t->xsk_));
  if (!t->xsk_->multi_buffer()) {
    // The kernel cannot split a frame over several of this socket's buffers: frames
    // longer than one go to the kernel socket (the program passes them).
    NR_RETURN_IF_ERROR(o.program->SetMaxLen(t->xsk_->rx_frame_room()));
  }
  t->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (t->epoll_fd_ < 0) return IoError(std::string("epoll_create1: ") + strerror(errno));
  for (int fd : {t->xsk_->fd(), t->udp_->PollFd()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(t->epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return IoError(std::string("epoll_ctl: ") + strerror(errno));
    }
  }
  t->neighbours_.reset(new xdp::NeighbourCache(t->dev_.ifindex));
  t->align_offset_ = o.rx_align_offset;
  // Room for a receive's worth of what cannot be read in place: 64 of the kernel
  // socket's largest datagrams, or ~450 MTU-9000 frames.
  t->scratch_.resize(size_t(64) << 16);
  NR_RETURN_IF_ERROR(o.program->SetSocket(o.queue, t->xsk_->fd()));
  *out = std::move(t);
  return Status::Ok();
}

XdpTransport::~XdpTransport() {
  if (program_ && xsk_) program_->SetSocket(xsk_->queue(), -1);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

std::string XdpTransport::Describe() const {
  return std::string("AF_XDP on queue ") + std::to_string(xsk_->queue()) + " of " + dev_.name +
         " (XDP " + program_->mode() + ", " + (xsk_->zero_copy() ? "zero-copy" : "copy mode") +
         (xsk_->multi_buffer() ? ", multi-buffer frames" : ", frames up to one buffer") + ")";
}

std::map<std::string, uint64_t> XdpTransport::Stats() const {
  std::map<std::string, uint64_t> m;
  m["rx_xsk"] = n_.rx_xsk;
  m["rx_kernel"] = n_.rx_kernel;
  m["rx_malformed"] = n_.rx_malformed;
  m["rx_lent"] = n_.rx_lent;
  m["tx_xsk"] = n_.tx_xsk;
  m["tx_dropped"] = n_.tx_dropped;
  m["tx_kernel_unresolved"] = n_.tx_kernel_unresolved;
  m["tx_kernel_stale"] = n_.tx_kernel_stale;
  m["tx_kernel_elsewhere"] = n_.tx_kernel_elsewhere;
  m["tx_kernel_oversize"] = n_.tx_kernel_oversize;
  m["tx_kernel_family"] = n_.tx_kernel_family;
  m["neighbour_lookups"] = neighbours_->lookups();
  m["tx_kicks"] = xsk_->kicks();
  m["tx_kicks_again"] = xsk_->kicks_again();
  uint64_t rx_dropped = 0, ring_full = 0, fill_empty = 0, tx_invalid = 0;
  xsk_->Statistics(&rx_dropped, &ring_full, &fill_empty, &tx_invalid);
  m["xsk_rx_dropped"] = rx_dropped;
  m["xsk_rx_ring_full"] = ring_full;
  m["xsk_fill_ring_empty"] = fill_empty;
  m["xsk_tx_invalid"] = tx_invalid;
  return m;
}

bool XdpTransport::NextPacket(uint32_t idx, uint32_t avail, RxPacket* p) const {
  p->first = idx;
  p->count = 0;
  p->len = 0;
  while (p->count < avail) {
    const xdp_desc* d = xsk_->RxDesc(idx + p->count);
    ++p->count;
    p->len += d->len;
    if (!(d->options & XDP_PKT_CONTD)) return true;
  }
  return false;
}

void XdpTransport::RecycleFrames(const RxPacket& p) {
  for (uint32_t i = 0; i < p.count; ++i) {
    xsk_->Recycle(xsk_->RxDesc(p.first + i)->addr & ~uint64_t(xdp::XskSocket::kFrameBytes - 1));
  }
}

size_t XdpTransport::CopyPayload(const RxPacket& p, size_t payload_offset, size_t skip,
                                 uint8_t* dst, size_t n) {
  size_t pos = payload_offset + skip;  // byte of the frame to copy next
  size_t done = 0;
  for (uint32_t i = 0; i < p.count && done < n; ++i) {
    const xdp_desc* d = xsk_->RxDesc(p.first + i);
    if (pos >= d->len) {
      pos -= d->len;
      continue;
    }
    const size_t take = std::min<size_t>(d->len - pos, n - done);
    memcpy(dst + done, xsk_->data(d->addr) + pos, take);
    done += take;
    pos = 0;
  }
  return done;
}

uint8_t* XdpTransport::Scratch(size_t bytes) {
  size_t at = scratch_used_ + 64;
  at -= (at + align_offset_) % 64;  // byte align_offset_ of the datagram on 64 bytes
  if (at + bytes > scratch_.size()) return nullptr;
  scratch_used_ = at + bytes;
  return scratch_.data() + at;
}

bool XdpTransport::Deliver(const RxPacket& p, InPacket* pkt, bool* full) {
  *full = false;
  const xdp_desc* d = xsk_->RxDesc(p.first);
  xdp::Parsed f;
  if (!xdp::ParseFrame(xsk_->data(d->addr), d->len, p.len, &f)) {
    ++n_.rx_malformed;
    RecycleFrames(p);
    return false;
  }
  if (p.count == 1) {  // read in place; the frame returns at the next receive
    pkt->buf = xsk_->data(d->addr) + f.payload_offset;
    lent_.push_back(d->addr & ~uint64_t(xdp::XskSocket::kFrameBytes - 1));
    ++n_.rx_lent;
  } else {
    uint8_t* at = Scratch(f.payload_len);
    if (at == nullptr) {
      *full = true;
      return false;
    }
    pkt->buf = at;
    CopyPayload(p, f.payload_offset, 0, at, f.payload_len);
    RecycleFrames(p);
  }
  pkt->cap = pkt->len = f.payload_len;
  pkt->from = Endpoint::Of(f.src, f.src_port_be);
  pkt->local_ip = f.dst.is_v4() ? f.dst.v4() : 0;
  pkt->local_ip6 = f.dst.is_v4() ? IpAddr() : f.dst;
  pkt->verified = false;
  pkt->kernel_checked = false;  // straight from the driver: no kernel checked its UDP checksum
  ++n_.rx_xsk;
  return true;
}

void XdpTransport::ReturnLent() {
  for (uint64_t a : lent_) xsk_->Recycle(a);
  lent_.clear();
}

Status XdpTransport::WaitBoth(int64_t timeout_us) {
  pollfd pfds[2] = {{xsk_->fd(), POLLIN, 0}, {udp_->PollFd(), POLLIN, 0}};
  timespec ts{time_t(timeout_us / 1000000), long((timeout_us % 1000000) * 1000)};
  if (ppoll(pfds, 2, &ts, nullptr) < 0 && errno != EINTR) {
    return IoError(std::string("ppoll: ") + strerror(errno));
  }
  return Status::Ok();
}

Status XdpTransport::RecvBatch(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) {
  *got = 0;
  ReturnLent();  // the caller is done with what the last receive handed it
  scratch_used_ = 0;
  if (max == 0) return Status::Ok();
  for (int pass = 0; pass < 2; ++pass) {
    size_t n = 0;
    bool full = false;
    if (held_ && !held_kernel_) {  // a packet PeekHeader looked at comes first
      held_ = false;
      if (Deliver(held_packet_, &pkts[n], &full)) ++n;
      if (full) RecycleFrames(held_packet_);  // (scratch is empty here: cannot happen)
      xsk_->RxRelease(held_packet_.count);
    }
    held_ = held_kernel_ = false;
    uint32_t idx = 0;
    const uint32_t want = uint32_t(std::min<size_t>(max * (xsk_->multi_buffer() ? 3 : 1), 4096));
    const uint32_t avail = n < max ? xsk_->RxPeek(want, &idx) : 0;
    uint32_t used = 0;
    while (n < max && used < avail) {
      RxPacket p;
      if (!NextPacket(idx + used, avail - used, &p)) break;  // its rest is still coming
      const bool ok = Deliver(p, &pkts[n], &full);
      if (full) break;  // no scratch left this time: it stays in the ring
      used += p.count;
      if (ok) ++n;
    }
    if (used < avail) xsk_->RxCancel(avail - used);
    if (used) xsk_->RxRelease(used);
    xsk_->Refill();
    // The kernel socket carries only what the program passed (rare on a steered
    // port): looked at when the ring had nothing, and every 16th call regardless.
    if (n == 0 || ++polls_since_kernel_ >= 16) {
      polls_since_kernel_ = 0;
      size_t room = 0;
      for (; n + room < max; ++room) {
        uint8_t* b = Scratch(65536);
        if (b == nullptr) break;
        pkts[n + room].buf = b;
        pkts[n + room].cap = 65536;
      }
      size_t k = 0;
      if (room) NR_RETURN_IF_ERROR(udp_->RecvBatch(pkts + n, room, 0, &k));
      n_.rx_kernel += k;
      n += k;
    }
    if (n > 0 || timeout_us <= 0 || pass == 1) {
      *got = n;
      return Status::Ok();
    }
    scratch_used_ = 0;  // nothing was handed out: start the scratch afresh
    NR_RETURN_IF_ERROR(WaitBoth(timeout_us));
  }
  return Status::Ok();
}

Status XdpTransport::PeekHeader(uint8_t* buf, size_t n, int64_t timeout_us, size_t* len,
                                Endpoint* from) {
  *len = 0;
  ReturnLent();
  for (int pass = 0; pass < 2; ++pass) {
    while (!held_) {
      uint32_t idx = 0;
      const uint32_t avail = xsk_->RxPeek(kMaxDescsPerPacket, &idx);
      if (avail == 0) break;
      RxPacket p;
      if (!NextPacket(idx, avail, &p)) {
        xsk_->RxCancel(avail);
        break;
      }
      if (avail > p.count) xsk_->RxCancel(avail - p.count);
      const xdp_desc* d = xsk_->RxDesc(p.first);
      if (!xdp::ParseFrame(xsk_->data(d->addr), d->len, p.len, &held_parsed_)) {
        ++n_.rx_malformed;
        RecycleFrames(p);
        xsk_->RxRelease(p.count);
        xsk_->Refill();
        continue;
      }
      held_ = true;
      held_kernel_ = false;
      held_packet_ = p;
    }
    if (held_ && !held_kernel_) {
      CopyPayload(held_packet_, held_parsed_.payload_offset, 0, buf,
                  std::min(n, held_parsed_.payload_len));
      *len = held_parsed_.payload_len;
      *from = Endpoint::Of(held_parsed_.src, held_parsed_.src_port_be);
      return Status::Ok();
    }
    NR_RETURN_IF_ERROR(udp_->PeekHeader(buf, n, 0, len, from));
    if (*len > 0) {
      held_ = held_kernel_ = true;
      return Status::Ok();
    }
    if (timeout_us <= 0 || pass == 1) return Status::Ok();
    NR_RETURN_IF_ERROR(WaitBoth(timeout_us));
  }
  return Status::Ok();
}

Status XdpTransport::RecvScatter(iovec* iov, int iovcnt, size_t* len) {
  if (!held_ || held_kernel_) {
    held_ = held_kernel_ = false;
    Status st = udp_->RecvScatter(iov, iovcnt, len);
    if (*len > 0) ++n_.rx_kernel;
    return st;
  }
  size_t done = 0;
  for (int i = 0; i < iovcnt && done < held_parsed_.payload_len; ++i) {
    const size_t take = std::min(iov[i].iov_len, held_parsed_.payload_len - done);
    done += CopyPayload(held_packet_, held_parsed_.payload_offset, done,
                        static_cast<uint8_t*>(iov[i].iov_base), take);
  }
  *len = done;
  RecycleFrames(held_packet_);
  xsk_->RxRelease(held_packet_.count);
  xsk_->Refill();
  held_ = false;
  ++n_.rx_xsk;
  return Status::Ok();
}

Status XdpTransport::SendXsk(const OutPacket& p, const xdp::NextHop& hop, size_t bytes,
                             bool* sent) {
  *sent = false;
  const IpAddr dst = p.to.address();
  const bool v6 = !dst.is_v4();
  IpAddr src = !p.from_ip6.unspecified() ? p.from_ip6
                                          : (p.from_ip != 0 ? IpAddr::V4(p.from_ip) : hop.src);
  if (src.unspecified()) src = v6 ? dev_.ip6 : dev_.ip4;
  if (src.unspecified() || src.is_v4() != dst.is_v4()) {
    ++n_.tx_kernel_family;  // no source of the destination's family here: the kernel's job
    return Status::Ok();
  }
  const size_t head = xdp::HeaderBytes(v6);
  const size_t frame_len = head + bytes;
  const size_t frame = xdp::XskSocket::kFrameBytes;
  const uint32_t frames = uint32_t((frame_len + frame - 1) / frame);
  if (frame_len - xdp::kEthBytes > size_t(dev_.mtu) || frames > kMaxDescsPerPacket ||
      (frames > 1 && !xsk_->multi_buffer())) {
    ++n_.tx_kernel_oversize;  // the socket reports the MTU error, or fragments nothing
    return Status::Ok();
  }
  if (xsk_->free_frames() < frames) {
    // Every frame is queued or in flight: have the kernel send the queue, then wait
    // for the completions that give them back (bounded, as a full socket blocks).
    for (int i = 0; xsk_->free_frames() < frames; ++i) {
      NR_RETURN_IF_ERROR(Kick());
      if (i > 1000) {
        return IoError("AF_XDP queue " + std::to_string(xsk_->queue()) + " of " + dev_.name +
                       " gets no transmit completions back");
      }
      if (i > 10) {
        pollfd pf{xsk_->fd(), POLLOUT, 0};
        poll(&pf, 1, 1);
      }
    }
  }
  uint64_t addr[kMaxDescsPerPacket];
  for (uint32_t f = 0; f < frames; ++f) xsk_->TakeFrame(&addr[f]);
  uint8_t* first = xsk_->data(addr[0]);
  uint32_t acc = xdp::WriteHeaders(first, dev_.mac, hop.mac, src, local().port, dst, p.to.port, bytes);
  bool odd = false;
  size_t pos = head;  // byte of the frame written next
  for (int k = 0; k < p.iovcnt; ++k) {
    const uint8_t* piece = static_cast<const uint8_t*>(p.iov[k].iov_base);
    const size_t len = p.iov[k].iov_len;
    for (size_t done = 0; done < len;) {  // copied and summed in one pass
      const size_t f = pos / frame, off = pos % frame;
      const size_t take = std::min(len - done, frame - off);
      acc = xdp::ChecksumCopy(acc, xsk_->data(addr[f]) + off, piece + done, take, &odd);
      done += take;
      pos += take;
    }
  }
  xdp::StoreUdpChecksum(first, v6, acc);
  for (uint32_t f = 0; f < frames; ++f) {
    const uint32_t len = uint32_t(std::min(frame, frame_len - size_t(f) * frame));
    while (!xsk_->Queue(addr[f], len, f + 1 < frames)) {  // the ring is full: send it
      NR_RETURN_IF_ERROR(Kick());
    }
  }
  ++n_.tx_xsk;
  *sent = true;
  return Status::Ok();
}

Status XdpTransport::Kick() {
  uint64_t dropped = 0;
  Status st = xsk_->Kick(true, &dropped);
  n_.tx_dropped += dropped;
  return st;
}

Status XdpTransport::SendBatch(OutPacket* pkts, size_t n) {
  const int64_t now = NowUs();
  via_kernel_.clear();
  for (size_t i = 0; i < n; ++i) {
    const OutPacket& p = pkts[i];
    size_t bytes = 0;
    for (int k = 0; k < p.iovcnt; ++k) bytes += p.iov[k].iov_len;
    const xdp::NextHop hop = neighbours_->Lookup(p.to.address(), now);
    bool sent = false;
    switch (hop.kind) {
      case xdp::NextHop::kDirect: NR_RETURN_IF_ERROR(SendXsk(p, hop, bytes, &sent)); break;
      case xdp::NextHop::kUnresolved: ++n_.tx_kernel_unresolved; break;
      case xdp::NextHop::kStale: ++n_.tx_kernel_stale; break;
      case xdp::NextHop::kElsewhere: ++n_.tx_kernel_elsewhere; break;
    }
    if (!sent) via_kernel_.push_back(p);
  }
  NR_RETURN_IF_ERROR(Kick());
  if (!via_kernel_.empty()) return udp_->SendBatch(via_kernel_.data(), via_kernel_.size());
  return Status::Ok();
}

Status OpenXdpTransports(const XdpSetup& setup, std::vector<std::unique_ptr<Transport>>* out,
                         std::shared_ptr<xdp::XdpProgram>* program, std::vector<std::string>* notes) {
  out->clear();
  IpAddr host;
  NR_RETURN_IF_ERROR(ResolveHost(setup.udp.host, &host));
  std::string device = setup.device;
  if (device.empty()) NR_RETURN_IF_ERROR(xdp::InterfaceForAddress(host, &device));
  xdp::ProgramConfig pc;
  NR_RETURN_IF_ERROR(xdp::InterfaceByName(device, &pc.dev));
  pc.port_base = setup.udp.port;
  pc.port_count = setup.count;
  pc.bound = host;
  // An IPv4 socket (0.0.0.0 included) hears no IPv6; "::" both; an IPv6 address only it.
  pc.accept_v4 = host.is_v4() || host.unspecified();
  pc.accept_v6 = !host.is_v4();
  pc.mode = setup.mode;
  NR_RETURN_IF_ERROR(xdp::XdpProgram::Attach(pc, program));
  for (uint32_t t = 0; t < setup.count; ++t) {
    XdpOptions o;
    o.udp = setup.udp;
    o.udp.port = uint16_t(setup.udp.port + t);
    if (setup.udp.port == 0 && t > 0) o.udp.port = uint16_t(ntohs(out->front()->local().port) + t);
    o.program = *program;
    o.queue = t;
    o.try_zero_copy = setup.try_zero_copy;
    o.rx_align_offset = setup.rx_align_offset;
    std::unique_ptr<XdpTransport> x;
    Status st = XdpTransport::Open(o, &x);
    if (st.ok()) {
      if (t == 0 && setup.udp.port == 0) {
        NR_RETURN_IF_ERROR((*program)->SetPorts(ntohs(x->local().port), setup.count));
      }
      out->push_back(std::move(x));
      continue;
    }
    if (t == 0) {  // no AF_XDP socket at all: the program would serve nobody
      out->clear();
      program->reset();
      return st;
    }
    notes->push_back("data port " + std::to_string(o.udp.port) + " (thread " + std::to_string(t) +
                     ") uses the kernel socket: " + st.message());
    std::unique_ptr<UdpTransport> u;
    NR_RETURN_IF_ERROR(UdpTransport::Open(o.udp, &u));
    out->push_back(std::move(u));
  }
  return Status::Ok();
}

}  // namespace netreduce
