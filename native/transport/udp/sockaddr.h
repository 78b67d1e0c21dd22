// Between the data plane's addresses (IpAddr, Endpoint) and the kernel's sockaddrs,
// for sockets of either family. An AF_INET6 socket bound to "::" is dual-stack
// (IPV6_V6ONLY off): it serves IPv4 peers too, which it names ::ffff:a.b.c.d, the
// very form IpAddr holds IPv4 in, so nothing above the socket converts anything.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace netreduce {

// "host" (an IPv4 or IPv6 literal, or a name) to an address. A name with both kinds
// of address resolves to its IPv4 one, as the control plane's resolve() does.
Status ResolveHost(const std::string& host, IpAddr* ip);

// The socket family that serves `local`: AF_INET for an IPv4 address, AF_INET6 for
// an IPv6 one (including "::", the dual-stack wildcard).
inline int FamilyFor(const IpAddr& local) { return local.is_v4() ? AF_INET : AF_INET6; }

// `e` as a sockaddr for a socket of `family`. False when that socket cannot reach it
// (an IPv6 peer from an AF_INET socket).
bool ToSockaddr(const Endpoint& e, int family, sockaddr_storage* out, socklen_t* len);
// A sockaddr_in or sockaddr_in6 the kernel filled in, as an Endpoint (an IPv4-mapped
// address as IPv4).
Endpoint FromSockaddr(const sockaddr_storage& sa);

}  // namespace netreduce
