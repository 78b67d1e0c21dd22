#include "transport/udp/udp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>

namespace netreduce {

static std::string Errno(const char* what) {
  return std::string(what) + ": " + strerror(errno);
}

// Room for one IP_PKTINFO and one IPV6_PKTINFO: a dual-stack socket may deliver both
// for an IPv4 datagram.
constexpr size_t kCmsgSpace = CMSG_SPACE(sizeof(in_pktinfo)) + CMSG_SPACE(sizeof(in6_pktinfo));

Status ResolveIpv4(const std::string& host, uint32_t* ip) {
  IpAddr a;
  NR_RETURN_IF_ERROR(ResolveHost(host, &a));
  if (!a.is_v4()) {
    return InvalidArgument("'" + host + "' is an IPv6 address where only IPv4 is supported "
                           "(multicast groups, verbs peers and the rack-to-spine uplink are "
                           "IPv4)");
  }
  *ip = a.v4();
  return Status::Ok();
}

Status LocalAddressFor(const Endpoint& peer, IpAddr* ip) {
  const int family = FamilyFor(peer.address());
  int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(Errno("socket"));
  sockaddr_storage sa{};
  socklen_t len = 0;
  ToSockaddr(peer, family, &sa, &len);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    Status st = IoError(Errno(("no route to aggregator " + ToString(peer)).c_str()));
    close(fd);
    return st;
  }
  len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  *ip = FromSockaddr(sa).address();
  return Status::Ok();
}

Status LocalAddressFor(const Endpoint& peer, uint32_t* ip) {
  IpAddr a;
  NR_RETURN_IF_ERROR(LocalAddressFor(peer, &a));
  if (!a.is_v4()) return InvalidArgument("no IPv4 address toward " + ToString(peer));
  *ip = a.v4();
  return Status::Ok();
}

Status PathMtu(const std::string& host, uint16_t port, int* mtu, bool* ipv6) {
  IpAddr ip;
  NR_RETURN_IF_ERROR(ResolveHost(host, &ip));
  const Endpoint peer = Endpoint::Of(ip, htons(port));
  const bool v6 = !ip.is_v4();
  const int family = FamilyFor(ip);
  int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(Errno("socket"));
  const int level = v6 ? IPPROTO_IPV6 : IPPROTO_IP;
  int pmtu = v6 ? IPV6_PMTUDISC_DO : IP_PMTUDISC_DO;
  setsockopt(fd, level, v6 ? IPV6_MTU_DISCOVER : IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
  sockaddr_storage sa{};
  socklen_t salen = 0;
  ToSockaddr(peer, family, &sa, &salen);
  Status st = Status::Ok();
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), salen) != 0) {
    st = IoError(Errno(("no route to aggregator " + ToString(peer)).c_str()));
  } else {
    int value = 0;
    socklen_t len = sizeof(value);
    if (getsockopt(fd, level, v6 ? IPV6_MTU : IP_MTU, &value, &len) != 0) {
      st = IoError(Errno(("path MTU toward " + ToString(peer)).c_str()));
    } else {
      *mtu = value;
      *ipv6 = v6;
    }
  }
  close(fd);
  return st;
}

static void SetBuffer(int fd, int force_opt, int opt, int bytes) {
  // SO_*BUFFORCE exceeds net.core.*mem_max when we have CAP_NET_ADMIN; else the
  // plain option is clamped by the kernel, which is still correct, only slower.
  if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof(bytes)) != 0) {
    setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof(bytes));
  }
}

Status UdpTransport::Open(const UdpOptions& opts, std::unique_ptr<UdpTransport>* out) {
  IpAddr ip;
  NR_RETURN_IF_ERROR(ResolveHost(opts.join_group.empty() ? opts.host : opts.join_group, &ip));
  const int family = FamilyFor(ip);
  const bool v6 = family == AF_INET6;
  if (!opts.join_group.empty() && v6) {
    return Status(Code::kRefused, "multicast group " + opts.join_group + " is IPv6; multicast "
                                  "fan-out is IPv4 (use --fanout unicast for IPv6 ranks)");
  }
  int fd = socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(Errno("socket"));
  SetBuffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, opts.rcvbuf_bytes);
  SetBuffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, opts.sndbuf_bytes);
  // The IPv4 options hold on an AF_INET6 socket too, for its IPv4 (mapped) traffic.
  int pmtu = IP_PMTUDISC_DO;
  setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
  int one = 1, zero = 0;
  setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one));
  // Only groups this very socket joined: another rank's membership on this host must
  // not leak multicast into a unicast socket.
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof(zero));
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &one, sizeof(one));
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_TTL, &opts.multicast_ttl, sizeof(opts.multicast_ttl));
  if (v6) {
    int pmtu6 = IPV6_PMTUDISC_DO;
    setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu6, sizeof(pmtu6));
    setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one));
    // "::" serves both families; a specific IPv6 address only its own.
    int v6only = ip.unspecified() ? 0 : 1;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
  }
  if (!opts.join_group.empty()) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    uint32_t iface = 0;
    IpAddr iface_ip;
    if (ResolveHost(opts.group_iface, &iface_ip).ok() && !iface_ip.is_v4()) {
      close(fd);  // an IPv6 rank: it cannot join an IPv4 group
      return Status(Code::kRefused, "the aggregator sends results to multicast group " +
                                        opts.join_group + ", IPv4, but this rank reaches it over "
                                        "IPv6 (" + opts.group_iface + "): start netreduce-switch "
                                        "with --fanout unicast for IPv6 ranks");
    }
    Status st = ResolveIpv4(opts.group_iface, &iface);
    ip_mreq mreq{};
    mreq.imr_multiaddr.s_addr = ip.v4();
    mreq.imr_interface.s_addr = iface;
    if (!st.ok() || setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof(mreq)) != 0) {
      Status err = st.ok() ? IoError(Errno(("join multicast group " + opts.join_group + " on " +
                                            opts.group_iface).c_str()))
                           : InvalidArgument("multicast group " + opts.join_group +
                                             " (IPv4) on interface " + opts.group_iface + ": " +
                                             st.message());
      close(fd);
      return err;
    }
  }
  sockaddr_storage sa{};
  socklen_t salen = 0;
  ToSockaddr(Endpoint::Of(ip, htons(opts.port)), family, &sa, &salen);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), salen) != 0) {
    Status st = IoError(Errno(("bind UDP " + ToString(ip, htons(opts.port))).c_str()));
    close(fd);
    return st;
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  out->reset(new UdpTransport(fd, family, FromSockaddr(sa)));
  return Status::Ok();
}

void UdpTransport::Reserve(size_t count) {
  if (msgs_.size() < count) {
    msgs_.resize(count);
    addrs_.resize(count);
    cmsg_.resize(count * kCmsgSpace);
  }
}

UdpTransport::~UdpTransport() {
  if (fd_ >= 0) close(fd_);
}

Status UdpTransport::SendBatch(OutPacket* pkts, size_t n) {
  const bool choose_source = local_.address().unspecified();
  size_t done = 0;
  while (done < n) {
    const size_t count = std::min<size_t>(n - done, 1024);
    Reserve(count);
    for (size_t i = 0; i < count; ++i) {
      OutPacket& p = pkts[done + i];
      msghdr& h = msgs_[i].msg_hdr;
      h = msghdr{};
      socklen_t salen = 0;
      if (!ToSockaddr(p.to, family_, &addrs_[i], &salen)) {
        return IoError("cannot send to IPv6 peer " + ToString(p.to) + " from the IPv4 socket " +
                       ToString(local_) + " (bind \"::\" to serve both families)");
      }
      h.msg_name = &addrs_[i];
      h.msg_namelen = salen;
      h.msg_iov = p.iov;
      h.msg_iovlen = p.iovcnt;
      const IpAddr source = p.from_ip6.unspecified() ? IpAddr::V4(p.from_ip) : p.from_ip6;
      if (choose_source && !source.unspecified()) {
        char* c = &cmsg_[i * kCmsgSpace];
        memset(c, 0, kCmsgSpace);
        h.msg_control = c;
        cmsghdr* cm;
        if (family_ == AF_INET) {
          h.msg_controllen = CMSG_SPACE(sizeof(in_pktinfo));
          cm = CMSG_FIRSTHDR(&h);
          cm->cmsg_level = IPPROTO_IP;
          cm->cmsg_type = IP_PKTINFO;
          cm->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
          reinterpret_cast<in_pktinfo*>(CMSG_DATA(cm))->ipi_spec_dst.s_addr = source.v4();
        } else {  // IPv6, or IPv4 mapped on a dual-stack socket: the kernel takes both
          h.msg_controllen = CMSG_SPACE(sizeof(in6_pktinfo));
          cm = CMSG_FIRSTHDR(&h);
          cm->cmsg_level = IPPROTO_IPV6;
          cm->cmsg_type = IPV6_PKTINFO;
          cm->cmsg_len = CMSG_LEN(sizeof(in6_pktinfo));
          memcpy(&reinterpret_cast<in6_pktinfo*>(CMSG_DATA(cm))->ipi6_addr, source.bytes, 16);
        }
      }
    }
    int rc = sendmmsg(fd_, msgs_.data(), unsigned(count), 0);
    if (rc < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
        pollfd pfd{fd_, POLLOUT, 0};
        poll(&pfd, 1, 10);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == ECONNREFUSED || errno == EHOSTUNREACH || errno == ENETUNREACH) {
        // A stale ICMP error on an unconnected socket: the packet is lost like any
        // other; retransmission repairs it.
        done += 1;
        continue;
      }
      if (errno == EMSGSIZE) {
        size_t bytes = 0;
        for (int k = 0; k < pkts[done].iovcnt; ++k) bytes += pkts[done].iov[k].iov_len;
        return IoError("a " + std::to_string(bytes) + "-byte datagram to " + ToString(pkts[done].to) +
                       " exceeds the path MTU (netreduce sets DF, so the kernel does not fragment): "
                       "the path's MTU fell after the job was admitted with a payload that fit, "
                       "or a hop has a smaller MTU than the hosts' interfaces; start "
                       "netreduce-switch with --payload-bytes at most the smallest MTU - 64 "
                       "(IPv4; MTU - 84 over IPv6), a multiple of 8 (e.g. 8936 for MTU 9000, "
                       "1432 for 1500, 1416 for 1500 over IPv6, 4096 for RoCE's 4200)");
      }
      return IoError(Errno(("sendmmsg to " + ToString(pkts[done].to)).c_str()));
    }
    done += size_t(rc);
  }
  return Status::Ok();
}

Status UdpTransport::RecvBatch(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) {
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
  int rc = recvmmsg(fd_, msgs_.data(), unsigned(max), MSG_DONTWAIT, nullptr);
  if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && timeout_us > 0) {
    pollfd pfd{fd_, POLLIN, 0};
    timespec ts{time_t(timeout_us / 1000000), long((timeout_us % 1000000) * 1000)};
    int prc = ppoll(&pfd, 1, &ts, nullptr);
    if (prc <= 0) return Status::Ok();
    rc = recvmmsg(fd_, msgs_.data(), unsigned(max), MSG_DONTWAIT, nullptr);
  }
  if (rc < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNREFUSED) {
      return Status::Ok();
    }
    return IoError(Errno("recvmmsg"));
  }
  for (int i = 0; i < rc; ++i) {
    InPacket& p = pkts[i];
    msghdr& h = msgs_[i].msg_hdr;
    p.len = msgs_[i].msg_len;
    if (h.msg_flags & MSG_TRUNC) p.len = p.cap + 1;  // oversize: caller drops it
    p.from = FromSockaddr(addrs_[i]);
    p.local_ip = local_.ip;
    p.local_ip6 = local_.ip6;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&h); cm != nullptr; cm = CMSG_NXTHDR(&h, cm)) {
      if (cm->cmsg_level == IPPROTO_IP && cm->cmsg_type == IP_PKTINFO) {
        p.local_ip = reinterpret_cast<in_pktinfo*>(CMSG_DATA(cm))->ipi_addr.s_addr;
        p.local_ip6 = IpAddr();
      } else if (cm->cmsg_level == IPPROTO_IPV6 && cm->cmsg_type == IPV6_PKTINFO) {
        const Endpoint local =
            Endpoint::Of(IpAddr::V6(reinterpret_cast<in6_pktinfo*>(CMSG_DATA(cm))->ipi6_addr), 0);
        p.local_ip = local.ip;  // an IPv4 datagram on a dual-stack socket comes mapped
        p.local_ip6 = local.ip6;
      }
    }
  }
  *got = size_t(rc);
  return Status::Ok();
}

Status WaitReadable(Transport* const* transports, size_t n, int64_t timeout_us) {
  pollfd pfds[4];
  n = std::min<size_t>(n, 4);
  for (size_t i = 0; i < n; ++i) {
    bool ready = false;
    NR_RETURN_IF_ERROR(transports[i]->PrepareWait(&ready));
    if (ready) return Status::Ok();
    pfds[i] = pollfd{transports[i]->PollFd(), POLLIN, 0};
  }
  timespec ts{time_t(timeout_us / 1000000), long((timeout_us % 1000000) * 1000)};
  if (ppoll(pfds, n, &ts, nullptr) < 0 && errno != EINTR) return IoError(Errno("ppoll"));
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
