#include "transport/xdp/netlink.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/if_packet.h>
#include <linux/neighbour.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

namespace netreduce {
namespace xdp {
namespace {

std::string Errno(const std::string& what) { return what + ": " + strerror(errno); }

uint32_t CountQueues(const std::string& dev, const char* prefix) {
  DIR* d = opendir(("/sys/class/net/" + dev + "/queues").c_str());
  if (d == nullptr) return 1;
  uint32_t n = 0;
  const size_t plen = strlen(prefix);
  while (dirent* e = readdir(d)) {
    if (strncmp(e->d_name, prefix, plen) == 0) ++n;
  }
  closedir(d);
  return n ? n : 1;
}

// Appends one rtnetlink attribute to the message at `msg` (whose nlmsg_len grows).
void AddAttr(nlmsghdr* msg, uint16_t type, const void* data, size_t len) {
  rtattr* a = reinterpret_cast<rtattr*>(reinterpret_cast<uint8_t*>(msg) + NLMSG_ALIGN(msg->nlmsg_len));
  a->rta_type = type;
  a->rta_len = uint16_t(RTA_LENGTH(len));
  memcpy(RTA_DATA(a), data, len);
  msg->nlmsg_len = uint32_t(NLMSG_ALIGN(msg->nlmsg_len) + RTA_ALIGN(a->rta_len));
}

IpAddr AddrFromAttr(const rtattr* a, int family) {
  IpAddr ip;
  if (family == AF_INET && RTA_PAYLOAD(a) >= 4) {
    uint32_t v;
    memcpy(&v, RTA_DATA(a), 4);
    ip = IpAddr::V4(v);
  } else if (family == AF_INET6 && RTA_PAYLOAD(a) >= 16) {
    memcpy(ip.bytes, RTA_DATA(a), 16);
  }
  return ip;
}

}  // namespace

Status InterfaceByName(const std::string& name, Interface* out) {
  const unsigned idx = if_nametoindex(name.c_str());
  if (idx == 0) return InvalidArgument("no network device '" + name + "' in this namespace");
  Interface i;
  i.name = name;
  i.ifindex = int(idx);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(Errno("socket"));
  ifreq req{};
  strncpy(req.ifr_name, name.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFMTU, &req) == 0) i.mtu = req.ifr_mtu;
  if (ioctl(fd, SIOCGIFFLAGS, &req) == 0) i.loopback = (req.ifr_flags & IFF_LOOPBACK) != 0;
  if (ioctl(fd, SIOCGIFHWADDR, &req) == 0) memcpy(i.mac.b, req.ifr_hwaddr.sa_data, 6);
  close(fd);
  i.rx_queues = CountQueues(name, "rx-");
  i.tx_queues = CountQueues(name, "tx-");
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || name != a->ifa_name) continue;
      if (a->ifa_addr->sa_family == AF_INET && i.ip4.unspecified()) {
        i.ip4 = IpAddr::V4(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
      } else if (a->ifa_addr->sa_family == AF_INET6 && i.ip6.unspecified()) {
        const in6_addr& v6 = reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr;
        if (!IN6_IS_ADDR_LINKLOCAL(&v6)) i.ip6 = IpAddr::V6(v6);
      }
    }
    freeifaddrs(list);
  }
  *out = i;
  return Status::Ok();
}

Status InterfaceForAddress(const IpAddr& ip, std::string* name) {
  if (ip.unspecified()) {
    return InvalidArgument("the wildcard address names no device: give the device to attach "
                           "the XDP program to (--xdp-device)");
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return IoError(Errno("getifaddrs"));
  Status st = InvalidArgument("no device in this namespace holds " + ToString(ip));
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    IpAddr have;
    if (a->ifa_addr->sa_family == AF_INET) {
      have = IpAddr::V4(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      have = IpAddr::V6(reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    } else {
      continue;
    }
    if (have == ip) {
      *name = a->ifa_name;
      st = Status::Ok();
      break;
    }
  }
  freeifaddrs(list);
  return st;
}

Rtnetlink::~Rtnetlink() {
  if (fd_ >= 0) close(fd_);
}

Status Rtnetlink::Open() {
  fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd_ < 0) return IoError(Errno("netlink socket"));
  // A request the kernel does not answer must not stall a data thread for long.
  timeval tv{0, 200000};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  int one = 1;  // errors for a request carry only its header back
  setsockopt(fd_, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof(one));
  sockaddr_nl sa{};
  sa.nl_family = AF_NETLINK;
  if (bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd_);
    fd_ = -1;
    return IoError(Errno("bind netlink socket"));
  }
  return Status::Ok();
}

Status Rtnetlink::Request(void* msg, size_t len, uint8_t* reply, size_t cap, size_t* got) {
  if (fd_ < 0) NR_RETURN_IF_ERROR(Open());
  nlmsghdr* h = static_cast<nlmsghdr*>(msg);
  h->nlmsg_seq = ++seq_;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd_, msg, len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) < 0) {
    return IoError(Errno("netlink send"));
  }
  for (;;) {  // skip any late answer to an earlier request that timed out
    ssize_t n = recv(fd_, reply, cap, 0);
    if (n < 0) return IoError(Errno("netlink receive"));
    const nlmsghdr* r = reinterpret_cast<const nlmsghdr*>(reply);
    if (size_t(n) < sizeof(nlmsghdr) || !NLMSG_OK(r, size_t(n))) return IoError("short netlink reply");
    if (r->nlmsg_seq != seq_) continue;
    *got = size_t(n);
    return Status::Ok();
  }
}

Status Rtnetlink::Resolve(const IpAddr& dst, NextHop* out) {
  *out = NextHop();
  const bool v6 = !dst.is_v4();
  const int family = v6 ? AF_INET6 : AF_INET;
  const uint8_t* addr = v6 ? dst.bytes : dst.bytes + 12;
  const size_t alen = v6 ? 16 : 4;
  alignas(nlmsghdr) uint8_t req[256] = {};
  alignas(nlmsghdr) uint8_t reply[4096];
  size_t got = 0;

  // 1. The route: which device, which gateway, which source.
  nlmsghdr* h = reinterpret_cast<nlmsghdr*>(req);
  h->nlmsg_len = NLMSG_LENGTH(sizeof(rtmsg));
  h->nlmsg_type = RTM_GETROUTE;
  h->nlmsg_flags = NLM_F_REQUEST;
  rtmsg* rt = static_cast<rtmsg*>(NLMSG_DATA(h));
  rt->rtm_family = uint8_t(family);
  rt->rtm_dst_len = uint8_t(alen * 8);
  AddAttr(h, RTA_DST, addr, alen);
  NR_RETURN_IF_ERROR(Request(req, h->nlmsg_len, reply, sizeof(reply), &got));
  const nlmsghdr* r = reinterpret_cast<const nlmsghdr*>(reply);
  if (r->nlmsg_type == NLMSG_ERROR) return Status::Ok();  // no route: the kernel says why
  if (r->nlmsg_type != RTM_NEWROUTE) return IoError("unexpected netlink reply to RTM_GETROUTE");
  const rtmsg* rr = static_cast<const rtmsg*>(NLMSG_DATA(r));
  if (rr->rtm_type != RTN_UNICAST && rr->rtm_type != RTN_MULTICAST) return Status::Ok();
  int oif = 0;
  IpAddr gateway;
  int rlen = int(RTM_PAYLOAD(r));
  for (const rtattr* a = RTM_RTA(rr); RTA_OK(a, rlen); a = RTA_NEXT(a, rlen)) {
    if (a->rta_type == RTA_OIF && RTA_PAYLOAD(a) >= 4) memcpy(&oif, RTA_DATA(a), 4);
    if (a->rta_type == RTA_GATEWAY) gateway = AddrFromAttr(a, family);
    if (a->rta_type == RTA_PREFSRC) out->src = AddrFromAttr(a, family);
  }
  if (oif != ifindex_) return Status::Ok();  // kElsewhere
  if (dst.is_multicast()) {
    out->kind = NextHop::kDirect;
    out->mac = MulticastMac(dst);
    return Status::Ok();
  }

  // 2. The next hop's MAC: the gateway's, or the destination's own on the link.
  const IpAddr hop = gateway.unspecified() ? dst : gateway;
  memset(req, 0, sizeof(req));
  h->nlmsg_len = NLMSG_LENGTH(sizeof(ndmsg));
  h->nlmsg_type = RTM_GETNEIGH;
  h->nlmsg_flags = NLM_F_REQUEST;
  ndmsg* nd = static_cast<ndmsg*>(NLMSG_DATA(h));
  nd->ndm_family = uint8_t(family);
  nd->ndm_ifindex = ifindex_;
  AddAttr(h, NDA_DST, v6 ? hop.bytes : hop.bytes + 12, alen);
  NR_RETURN_IF_ERROR(Request(req, h->nlmsg_len, reply, sizeof(reply), &got));
  out->kind = NextHop::kUnresolved;
  if (r->nlmsg_type != RTM_NEWNEIGH) return Status::Ok();  // ENOENT: never resolved
  const ndmsg* nr = static_cast<const ndmsg*>(NLMSG_DATA(r));
  int nlen = int(r->nlmsg_len - NLMSG_LENGTH(sizeof(ndmsg)));
  bool have_mac = false;
  for (const rtattr* a = reinterpret_cast<const rtattr*>(reinterpret_cast<const uint8_t*>(nr) +
                                                         NLMSG_ALIGN(sizeof(ndmsg)));
       RTA_OK(a, nlen); a = RTA_NEXT(a, nlen)) {
    if (a->rta_type == NDA_LLADDR && RTA_PAYLOAD(a) == 6) {
      memcpy(out->mac.b, RTA_DATA(a), 6);
      have_mac = true;
    }
  }
  const uint16_t st = nr->ndm_state;
  if (!have_mac || (st & (NUD_INCOMPLETE | NUD_FAILED | NUD_NONE)) || st == 0) return Status::Ok();
  out->kind = (st & NUD_STALE) ? NextHop::kStale : NextHop::kDirect;
  return Status::Ok();
}

NextHop NeighbourCache::Lookup(const IpAddr& dst, int64_t now_us) {
  auto it = map_.find(dst);
  if (it != map_.end() && now_us < it->second.expires_us) return it->second.hop;
  NextHop hop;
  ++lookups_;
  if (!nl_.Resolve(dst, &hop).ok()) hop.kind = NextHop::kElsewhere;  // the kernel sends it
  Entry e;
  e.hop = hop;
  e.expires_us = now_us + (hop.kind == NextHop::kUnresolved ? kUnresolvedTtlUs : kTtlUs);
  if (hop.kind == NextHop::kStale) e.hop.kind = NextHop::kDirect;  // the kernel confirms it
  map_[dst] = e;
  return hop;
}

}  // namespace xdp
}  // namespace netreduce
