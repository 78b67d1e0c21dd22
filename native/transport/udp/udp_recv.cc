// UdpTransport's receive side: recvmmsg into the caller's buffers, or with UDP_GRO
// into the transport's own 64 KiB buffers, where one receive may hold a run of
// datagrams of one flow (coalesced by the kernel's GRO, or a GSO send that veth and a
// bridge carried whole), split here by the segment size the kernel reports. A lost
// datagram is still a lost datagram: GRO only joins what arrived.
#include <errno.h>
#include <netinet/udp.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>

#include "transport/udp/udp_transport.h"

namespace netreduce {
namespace {

std::string Errno(const char* what) { return std::string(what) + ": " + strerror(errno); }

Status RecvError() { return IoError(Errno("recvmmsg")); }

// recvmmsg without waiting; if nothing is there and timeout_us > 0, one ppoll and a
// second try. *rc < 0 with Ok: nothing arrived.
Status Receive(int fd, mmsghdr* msgs, size_t n, int64_t timeout_us, int* rc) {
  *rc = recvmmsg(fd, msgs, unsigned(n), MSG_DONTWAIT, nullptr);
  if (*rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && timeout_us > 0) {
    pollfd pfd{fd, POLLIN, 0};
    timespec ts{time_t(timeout_us / 1000000), long((timeout_us % 1000000) * 1000)};
    if (ppoll(&pfd, 1, &ts, nullptr) <= 0) return Status::Ok();
    *rc = recvmmsg(fd, msgs, unsigned(n), MSG_DONTWAIT, nullptr);
  }
  if (*rc < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNREFUSED) {
      return Status::Ok();
    }
    return RecvError();
  }
  return Status::Ok();
}

}  // namespace

// Sender and targeted local address of a received message; *segment = the UDP_GRO
// segment size (0 when the receive holds one datagram).
static void ReadMeta(const Endpoint& local, const sockaddr_storage& from, msghdr& h, InPacket* p,
                     size_t* segment) {
  p->from = FromSockaddr(from);
  p->kernel_checked = true;  // udp_rcv drops a datagram whose set checksum is wrong
  p->local_ip = local.ip;
  p->local_ip6 = local.ip6;
  *segment = 0;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&h); cm != nullptr; cm = CMSG_NXTHDR(&h, cm)) {
    if (cm->cmsg_level == IPPROTO_IP && cm->cmsg_type == IP_PKTINFO) {
      p->local_ip = reinterpret_cast<in_pktinfo*>(CMSG_DATA(cm))->ipi_addr.s_addr;
      p->local_ip6 = IpAddr();
    } else if (cm->cmsg_level == IPPROTO_IPV6 && cm->cmsg_type == IPV6_PKTINFO) {
      const Endpoint l =
          Endpoint::Of(IpAddr::V6(reinterpret_cast<in6_pktinfo*>(CMSG_DATA(cm))->ipi6_addr), 0);
      p->local_ip = l.ip;  // an IPv4 datagram on a dual-stack socket comes mapped
      p->local_ip6 = l.ip6;
    } else if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
      int seg = 0;
      memcpy(&seg, CMSG_DATA(cm), sizeof(seg));
      *segment = seg > 0 ? size_t(seg) : 0;
    }
  }
}

// A segment of a coalesced receive takes its receive's sender and addresses.
static void TakeMeta(const InPacket& meta, InPacket* p) {
  p->from = meta.from;
  p->local_ip = meta.local_ip;
  p->local_ip6 = meta.local_ip6;
  p->kernel_checked = meta.kernel_checked;
}

Status UdpTransport::RecvBatch(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) {
  if (gro_) return RecvCoalesced(pkts, max, timeout_us, got);
  *got = 0;
  max = std::min<size_t>(max, 1024);
  Reserve(max);
  if (iovs_.size() < max) iovs_.resize(max);
  iovec* iovs = iovs_.data();
  for (size_t i = 0; i < max; ++i) {
    iovs[i].iov_base = pkts[i].buf;
    iovs[i].iov_len = pkts[i].cap;
    msghdr& h = msgs_[i].msg_hdr;
    h = msghdr{};
    h.msg_name = &addrs_[i];
    h.msg_namelen = sizeof(sockaddr_storage);
    h.msg_iov = &iovs[i];
    h.msg_iovlen = 1;
    h.msg_control = &cmsg_[i * kCmsgSpace];
    h.msg_controllen = kCmsgSpace;
  }
  int rc = -1;
  NR_RETURN_IF_ERROR(Receive(fd_, msgs_.data(), max, timeout_us, &rc));
  for (int i = 0; i < rc; ++i) {
    InPacket& p = pkts[i];
    msghdr& h = msgs_[i].msg_hdr;
    p.len = msgs_[i].msg_len;
    if (h.msg_flags & MSG_TRUNC) p.len = p.cap + 1;  // oversize: caller drops it
    size_t segment = 0;
    ReadMeta(local_, addrs_[i], h, &p, &segment);
  }
  *got = rc > 0 ? size_t(rc) : 0;
  return Status::Ok();
}

size_t UdpTransport::TakePending(InPacket* pkts, size_t max) {
  size_t n = 0;
  while (n < max && pending_next_ < pending_.size()) {
    const Segment& s = pending_[pending_next_++];
    InPacket& p = pkts[n++];
    const InPacket& m = pending_meta_[s.msg];
    p.buf = s.buf;
    p.cap = kGroBufBytes;
    p.len = s.len;
    TakeMeta(m, &p);
  }
  if (pending_next_ == pending_.size()) {
    pending_.clear();
    pending_next_ = 0;
  }
  return n;
}

Status UdpTransport::RecvCoalesced(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) {
  *got = 0;
  if (max == 0) return Status::Ok();
  // Segments of the previous receive come first; its buffers are not reused until
  // they are all handed over.
  if (pending_next_ < pending_.size()) {
    *got = TakePending(pkts, max);
    return Status::Ok();
  }
  if (!gro_mem_) {
    void* mem = mmap(nullptr, kGroMemBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return IoError(std::string("mmap GRO buffers: ") + strerror(errno));
    gro_mem_ = static_cast<uint8_t*>(mem);  // pages are touched only as data lands
  }
  // As many receives as the byte budget allows, judged by the previous receive's
  // largest: coalesced 64 KiB runs take few, single datagrams many.
  const size_t largest = std::max<size_t>(gro_last_largest_, 1024);
  const size_t n = std::max<size_t>(1, std::min({kGroSlots, max, recv_batch_bytes_ / largest}));
  Reserve(n);
  if (iovs_.size() < n) iovs_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    iovs_[i].iov_base = gro_mem_ + i * kGroStride;
    iovs_[i].iov_len = kGroBufBytes;
    msghdr& h = msgs_[i].msg_hdr;
    h = msghdr{};
    h.msg_name = &addrs_[i];
    h.msg_namelen = sizeof(sockaddr_storage);
    h.msg_iov = &iovs_[i];
    h.msg_iovlen = 1;
    h.msg_control = &cmsg_[i * kCmsgSpace];
    h.msg_controllen = kCmsgSpace;
  }
  int rc = -1;
  NR_RETURN_IF_ERROR(Receive(fd_, msgs_.data(), n, timeout_us, &rc));
  if (rc <= 0) return Status::Ok();
  if (pending_meta_.size() < size_t(rc)) pending_meta_.resize(size_t(rc));
  size_t out = 0;
  size_t biggest = 0;
  for (int i = 0; i < rc; ++i) {
    msghdr& h = msgs_[i].msg_hdr;
    InPacket& meta = pending_meta_[size_t(i)];
    size_t segment = 0;
    ReadMeta(local_, addrs_[i], h, &meta, &segment);
    uint8_t* buf = static_cast<uint8_t*>(iovs_[i].iov_base);
    size_t len = msgs_[i].msg_len;
    biggest = std::max(biggest, len);
    if (h.msg_flags & MSG_TRUNC) {  // cannot happen below 64 KiB; dropped as oversize
      segment = 0;
      len = kGroBufBytes + 1;
    }
    if (segment == 0 || segment >= len) segment = len;
    for (size_t off = 0; off < len; off += segment) {
      const size_t seg_len = std::min(segment, len - off);
      if (out < max) {
        InPacket& p = pkts[out++];
        p.buf = buf + off;
        p.cap = kGroBufBytes;
        p.len = seg_len;
        TakeMeta(meta, &p);
      } else {
        pending_.push_back(Segment{buf + off, seg_len, size_t(i)});
      }
    }
  }
  gro_last_largest_ = biggest;
  *got = out;
  return Status::Ok();
}

Status WaitReadable(Transport* const* transports, size_t n, int64_t timeout_us, bool* readable) {
  pollfd pfds[4];
  if (readable != nullptr) std::fill(readable, readable + n, true);
  n = std::min<size_t>(n, 4);
  for (size_t i = 0; i < n; ++i) {
    bool ready = false;
    NR_RETURN_IF_ERROR(transports[i]->PrepareWait(&ready));
    if (ready) return Status::Ok();
    pfds[i] = pollfd{transports[i]->PollFd(), POLLIN, 0};
  }
  timespec ts{time_t(timeout_us / 1000000), long((timeout_us % 1000000) * 1000)};
  const int rc = ppoll(pfds, n, &ts, nullptr);
  if (rc < 0 && errno != EINTR) return IoError(Errno("ppoll"));
  if (rc >= 0 && readable != nullptr) {
    for (size_t i = 0; i < n; ++i) readable[i] = pfds[i].revents != 0;
  }
  return Status::Ok();
}

Status UdpTransport::PeekHeader(uint8_t* buf, size_t n, int64_t timeout_us, size_t* len,
                                Endpoint* from) {
  *len = 0;
  sockaddr_storage sa{};
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t salen = sizeof(sa);
    ssize_t rc = recvfrom(fd_, buf, n, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT,
                          reinterpret_cast<sockaddr*>(&sa), &salen);
    if (rc >= 0) {
      *len = size_t(rc);  // MSG_TRUNC: the datagram's full length
      *from = FromSockaddr(sa);
      return Status::Ok();
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNREFUSED) {
      return IoError(Errno("recvfrom(MSG_PEEK)"));
    }
    if (attempt == 1 || timeout_us <= 0) break;
    pollfd pfd{fd_, POLLIN, 0};
    timespec ts{time_t(timeout_us / 1000000), long((timeout_us % 1000000) * 1000)};
    if (ppoll(&pfd, 1, &ts, nullptr) <= 0) break;
  }
  return Status::Ok();
}

Status UdpTransport::RecvScatter(iovec* iov, int iovcnt, size_t* len) {
  msghdr h{};
  h.msg_iov = iov;
  h.msg_iovlen = iovcnt;
  ssize_t rc = recvmsg(fd_, &h, MSG_DONTWAIT);
  if (rc < 0) {
    *len = 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
    return IoError(Errno("recvmsg"));
  }
  *len = size_t(rc);
  return Status::Ok();
}

}  // namespace netreduce
