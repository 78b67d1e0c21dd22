#include "transport/udp/sockaddr.h"

#include <netdb.h>

#include <cstring>

namespace netreduce {

Status ResolveHost(const std::string& host, IpAddr* ip) {
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    *ip = IpAddr::V4(v4.s_addr);
    return Status::Ok();
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    *ip = IpAddr::V6(v6);
    return Status::Ok();
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return InvalidArgument("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  const addrinfo* pick = res;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) { pick = a; break; }
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, pick->ai_addr, pick->ai_addrlen);
  freeaddrinfo(res);
  *ip = FromSockaddr(ss).address();
  return Status::Ok();
}

bool ToSockaddr(const Endpoint& e, int family, sockaddr_storage* out, socklen_t* len) {
  std::memset(out, 0, sizeof(*out));
  if (family == AF_INET) {
    if (e.is_v6()) return false;
    auto* sa = reinterpret_cast<sockaddr_in*>(out);
    sa->sin_family = AF_INET;
    sa->sin_addr.s_addr = e.ip;
    sa->sin_port = e.port;
    *len = sizeof(sockaddr_in);
    return true;
  }
  auto* sa = reinterpret_cast<sockaddr_in6*>(out);
  sa->sin6_family = AF_INET6;
  std::memcpy(&sa->sin6_addr, e.address().bytes, 16);  // IPv4 mapped on a dual-stack socket
  sa->sin6_port = e.port;
  *len = sizeof(sockaddr_in6);
  return true;
}

Endpoint FromSockaddr(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    const auto* sa = reinterpret_cast<const sockaddr_in*>(&ss);
    return Endpoint::Of(IpAddr::V4(sa->sin_addr.s_addr), sa->sin_port);
  }
  const auto* sa = reinterpret_cast<const sockaddr_in6*>(&ss);
  return Endpoint::Of(IpAddr::V6(sa->sin6_addr), sa->sin6_port);
}

}  // namespace netreduce
