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

std::string ToString(const Endpoint& e) {
  char buf[INET_ADDRSTRLEN] = {0};
  in_addr a;
  a.s_addr = e.ip;
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(ntohs(e.port));
}

static std::string Errno(const char* what) {
  return std::string(what) + ": " + strerror(errno);
}

Status ResolveIpv4(const std::string& host, uint32_t* ip) {
  in_addr a;
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) {
    *ip = a.s_addr;
    return Status::Ok();
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return InvalidArgument("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  *ip = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr.s_addr;
  freeaddrinfo(res);
  return Status::Ok();
}

Status LocalAddressFor(const Endpoint& peer, uint32_t* ip) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return IoError(Errno("socket"));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = peer.ip;
  sa.sin_port = peer.port;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    Status st = IoError(Errno(("no route to aggregator " + ToString(peer)).c_str()));
    close(fd);
    return st;
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  *ip = sa.sin_addr.s_addr;
  return Status::Ok();
}

Status PathMtu(const std::string& host, uint16_t port, int* mtu, bool* ipv6) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return InvalidArgument("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  // IPv4 first: the data plane speaks RoCEv2 over IPv4.
  addrinfo* pick = res;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) { pick = a; break; }
  }
  const bool v6 = pick->ai_family == AF_INET6;
  int fd = socket(pick->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return IoError(Errno("socket"));
  }
  int pmtu = v6 ? IPV6_PMTUDISC_DO : IP_PMTUDISC_DO;
  setsockopt(fd, v6 ? IPPROTO_IPV6 : IPPROTO_IP, v6 ? IPV6_MTU_DISCOVER : IP_MTU_DISCOVER, &pmtu,
             sizeof(pmtu));
  Status st = Status::Ok();
  if (connect(fd, pick->ai_addr, pick->ai_addrlen) != 0) {
    st = IoError(Errno(("no route to aggregator " + host + " port " + service).c_str()));
  } else {
    int value = 0;
    socklen_t len = sizeof(value);
    if (getsockopt(fd, v6 ? IPPROTO_IPV6 : IPPROTO_IP, v6 ? IPV6_MTU : IP_MTU, &value, &len) != 0) {
      st = IoError(Errno(("path MTU toward " + host).c_str()));
    } else {
      *mtu = value;
      *ipv6 = v6;
    }
  }
  close(fd);
  freeaddrinfo(res);
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
  uint32_t ip = 0;
  NR_RETURN_IF_ERROR(ResolveIpv4(opts.join_group.empty() ? opts.host : opts.join_group, &ip));
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(Errno("socket"));
  SetBuffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, opts.rcvbuf_bytes);
  SetBuffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, opts.sndbuf_bytes);
  int pmtu = IP_PMTUDISC_DO;
  setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
  int one = 1, zero = 0;
  setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one));
  // Only groups this very socket joined: another rank's membership on this host must
  // not leak multicast into a unicast socket.
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof(zero));
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &one, sizeof(one));
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_TTL, &opts.multicast_ttl, sizeof(opts.multicast_ttl));
  if (!opts.join_group.empty()) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    uint32_t iface = 0;
    Status st = ResolveIpv4(opts.group_iface, &iface);
    ip_mreq mreq{};
    mreq.imr_multiaddr.s_addr = ip;
    mreq.imr_interface.s_addr = iface;
    if (!st.ok() || setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof(mreq)) != 0) {
      Status err = st.ok() ? IoError(Errno(("join multicast group " + opts.join_group + " on " +
                                            opts.group_iface).c_str()))
                           : st;
      close(fd);
      return err;
    }
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = ip;
  sa.sin_port = htons(opts.port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    Status st = IoError(Errno(("bind UDP " + opts.host + ":" + std::to_string(opts.port)).c_str()));
    close(fd);
    return st;
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  out->reset(new UdpTransport(fd, Endpoint{sa.sin_addr.s_addr, sa.sin_port}));
  return Status::Ok();
}

UdpTransport::~UdpTransport() {
  if (fd_ >= 0) close(fd_);
}

Status UdpTransport::SendBatch(OutPacket* pkts, size_t n) {
  constexpr size_t kCmsgSpace = CMSG_SPACE(sizeof(in_pktinfo));
  const bool choose_source = local_.ip == htonl(INADDR_ANY);
  size_t done = 0;
  while (done < n) {
    const size_t count = std::min<size_t>(n - done, 1024);
    if (msgs_.size() < count) {
      msgs_.resize(count);
      addrs_.resize(count);
      cmsg_.resize(count * kCmsgSpace);
    }
    for (size_t i = 0; i < count; ++i) {
      OutPacket& p = pkts[done + i];
      sockaddr_in& sa = addrs_[i];
      sa = sockaddr_in{};
      sa.sin_family = AF_INET;
      sa.sin_addr.s_addr = p.to.ip;
      sa.sin_port = p.to.port;
      msghdr& h = msgs_[i].msg_hdr;
      h = msghdr{};
      h.msg_name = &sa;
      h.msg_namelen = sizeof(sa);
      h.msg_iov = p.iov;
      h.msg_iovlen = p.iovcnt;
      if (choose_source && p.from_ip != 0) {
        char* c = &cmsg_[i * kCmsgSpace];
        memset(c, 0, kCmsgSpace);
        h.msg_control = c;
        h.msg_controllen = kCmsgSpace;
        cmsghdr* cm = CMSG_FIRSTHDR(&h);
        cm->cmsg_level = IPPROTO_IP;
        cm->cmsg_type = IP_PKTINFO;
        cm->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
        in_pktinfo* pi = reinterpret_cast<in_pktinfo*>(CMSG_DATA(cm));
        pi->ipi_spec_dst.s_addr = p.from_ip;
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
                       "(e.g. 8936 for MTU 9000, 1432 for 1500, 4096 for RoCE's 4200)");
      }
      return IoError(Errno(("sendmmsg to " + ToString(pkts[done].to)).c_str()));
    }
    done += size_t(rc);
  }
  return Status::Ok();
}

Status UdpTransport::RecvBatch(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) {
  constexpr size_t kCmsgSpace = CMSG_SPACE(sizeof(in_pktinfo));
  *got = 0;
  max = std::min<size_t>(max, 1024);
  if (msgs_.size() < max) {
    msgs_.resize(max);
    addrs_.resize(max);
    cmsg_.resize(max * kCmsgSpace);
  }
  if (iovs_.size() < max) iovs_.resize(max);
  iovec* iovs = iovs_.data();
  for (size_t i = 0; i < max; ++i) {
    iovs[i].iov_base = pkts[i].buf;
    iovs[i].iov_len = pkts[i].cap;
    msghdr& h = msgs_[i].msg_hdr;
    h = msghdr{};
    h.msg_name = &addrs_[i];
    h.msg_namelen = sizeof(sockaddr_in);
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
    p.from = Endpoint{addrs_[i].sin_addr.s_addr, addrs_[i].sin_port};
    p.local_ip = local_.ip;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&h); cm != nullptr; cm = CMSG_NXTHDR(&h, cm)) {
      if (cm->cmsg_level == IPPROTO_IP && cm->cmsg_type == IP_PKTINFO) {
        p.local_ip = reinterpret_cast<in_pktinfo*>(CMSG_DATA(cm))->ipi_addr.s_addr;
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
  sockaddr_in sa{};
  socklen_t salen = sizeof(sa);
  for (int attempt = 0; attempt < 2; ++attempt) {
    ssize_t rc = recvfrom(fd_, buf, n, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT,
                          reinterpret_cast<sockaddr*>(&sa), &salen);
    if (rc >= 0) {
      *len = size_t(rc);  // MSG_TRUNC: the datagram's full length
      *from = Endpoint{sa.sin_addr.s_addr, sa.sin_port};
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
