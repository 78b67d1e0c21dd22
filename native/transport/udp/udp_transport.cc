#include "transport/udp/udp_transport.h"

#include <netinet/udp.h>
#include <sys/mman.h>

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
  // NOLINTNEXTLINE(bugprone-branch-clone): both are 2 on Linux, named for each family
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
  sockaddr_storage sa{};
  socklen_t salen = sizeof(sa);
  const bool adopted = opts.fd >= 0;
  if (adopted) {  // bound by the caller: its address is the socket's
    if (getsockname(opts.fd, reinterpret_cast<sockaddr*>(&sa), &salen) != 0 ||
        (sa.ss_family != AF_INET && sa.ss_family != AF_INET6)) {
      Status st = InvalidArgument("the data socket handed over (fd " + std::to_string(opts.fd) +
                                  ") is not a bound IP socket");
      close(opts.fd);
      return st;
    }
    ip = FromSockaddr(sa).address();
    if (sa.ss_family == AF_INET6 && ip.is_v4()) ip = IpAddr();  // a dual-stack socket
    fcntl(opts.fd, F_SETFL, fcntl(opts.fd, F_GETFL) | O_NONBLOCK);
  } else {
    NR_RETURN_IF_ERROR(ResolveHost(opts.join_group.empty() ? opts.host : opts.join_group, &ip));
  }
  const int family = adopted ? int(sa.ss_family) : FamilyFor(ip);
  const bool v6 = family == AF_INET6;
  if (!opts.join_group.empty() && v6) {
    if (adopted) close(opts.fd);
    return Status(Code::kRefused, "multicast group " + opts.join_group + " is IPv6; multicast "
                                  "fan-out is IPv4 (use --fanout unicast for IPv6 ranks)");
  }
  int fd = adopted ? opts.fd : socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
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
    // "::" serves both families; a specific IPv6 address only its own (a bound
    // socket's is fixed already).
    int v6only = ip.unspecified() ? 0 : 1;
    if (!adopted) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
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
  salen = 0;
  if (!adopted) ToSockaddr(Endpoint::Of(ip, htons(opts.port)), family, &sa, &salen);
  if (!adopted && bind(fd, reinterpret_cast<sockaddr*>(&sa), salen) != 0) {
    Status st = IoError(Errno(("bind UDP " + ToString(ip, htons(opts.port))).c_str()));
    close(fd);
    return st;
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  std::unique_ptr<UdpTransport> t(new UdpTransport(fd, family, FromSockaddr(sa)));
  t->recv_batch_bytes_ = std::max<size_t>(opts.recv_batch_bytes, 65536);
  int rcvbuf = 0;
  socklen_t rcvbuf_len = sizeof(rcvbuf);
  if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &rcvbuf_len) == 0 && rcvbuf > 0) {
    t->rcvbuf_ = size_t(rcvbuf);
  }
  // UDP_SEGMENT (Linux 4.18) takes the segment size per send, as a control message;
  // the socket option is set to 0 here only to learn whether the kernel knows it. A
  // device that cannot segment (no checksum offload, an xfrm path) answers a GSO send
  // with EIO instead: udp_send.cc then falls back for good.
  if (opts.gso) {
    int zero_seg = 0;
    if (setsockopt(fd, SOL_UDP, UDP_SEGMENT, &zero_seg, sizeof(zero_seg)) == 0) {
      t->gso_ = true;
    } else {
      t->gso_note_ = Errno("setsockopt UDP_SEGMENT");
    }
  }
  // UDP_GRO (Linux 5.0): the kernel may hand over runs of datagrams of one flow as one
  // receive, the segment size in a control message (udp_recv.cc splits them).
  if (opts.gro) {
    int on = 1;
    if (setsockopt(fd, SOL_UDP, UDP_GRO, &on, sizeof(on)) == 0) {
      t->gro_ = true;
    } else {
      t->gro_note_ = Errno("setsockopt UDP_GRO");
    }
  }
  *out = std::move(t);
  return Status::Ok();
}

std::string UdpTransport::Describe() const {
  std::lock_guard<std::mutex> lock(note_mu_);
  std::string d = "udp ";
  if (gso_ && gro_) {
    d += "gso+gro";
  } else if (gso_) {
    d += "gso, recvmmsg";
  } else if (gro_) {
    d += "sendmmsg, gro";
  } else {
    d += "sendmmsg/recvmmsg";
  }
  if (!gso_note_.empty()) d += " (no GSO: " + gso_note_ + ")";
  if (!gro_note_.empty()) d += " (no GRO: " + gro_note_ + ")";
  return d;
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
  if (gro_mem_ != nullptr) munmap(gro_mem_, kGroMemBytes);
}

}  // namespace netreduce
