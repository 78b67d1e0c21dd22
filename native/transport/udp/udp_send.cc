// UdpTransport's send side: sendmmsg of one datagram per message, or with GSO one
// run of datagrams per message (gso_runs.h) that the kernel cuts apart after routing,
// in the device's segmentation offload or in software just before the device: one
// trip through the stack and one socket-buffer charge per run instead of per packet.
#include <errno.h>
#include <netinet/udp.h>
#include <poll.h>
#include <string.h>

#include <algorithm>

#include "transport/udp/gso_runs.h"
#include "transport/udp/udp_transport.h"
#include "wire/roce.h"

namespace netreduce {
namespace {

// UDP payload bytes one GSO send may carry: IPv4's 65535 less its IP and UDP headers
// (IPv6 would allow 20 more; one bound keeps the runs alike).
constexpr uint32_t kMaxGsoBytes = 65535 - 20 - 8;
constexpr size_t kMaxMessages = 1024;  // sendmmsg's UIO_MAXIOV
// A packet's pieces up to this many bytes (a header, a trailer) are copied together
// into one iovec of a GSO send rather than handed to the kernel each on its own.
constexpr size_t kJoinBytes = 64;

// The control messages of one send: the source address (when bound to the wildcard)
// and the GSO segment size (0 = a plain datagram).
void SetControl(msghdr& h, char* c, int family, bool choose_source, const OutPacket& p,
                uint16_t gso_size) {
  const IpAddr source = p.from_ip6.unspecified() ? IpAddr::V4(p.from_ip) : p.from_ip6;
  const bool pktinfo = choose_source && !source.unspecified();
  if (!pktinfo && gso_size == 0) return;
  memset(c, 0, kCmsgSpace);
  h.msg_control = c;
  h.msg_controllen = kCmsgSpace;
  cmsghdr* cm = CMSG_FIRSTHDR(&h);
  size_t used = 0;
  if (pktinfo) {
    if (family == AF_INET) {
      cm->cmsg_level = IPPROTO_IP;
      cm->cmsg_type = IP_PKTINFO;
      cm->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
      reinterpret_cast<in_pktinfo*>(CMSG_DATA(cm))->ipi_spec_dst.s_addr = source.v4();
      used += CMSG_SPACE(sizeof(in_pktinfo));
    } else {  // IPv6, or IPv4 mapped on a dual-stack socket: the kernel takes both
      cm->cmsg_level = IPPROTO_IPV6;
      cm->cmsg_type = IPV6_PKTINFO;
      cm->cmsg_len = CMSG_LEN(sizeof(in6_pktinfo));
      memcpy(&reinterpret_cast<in6_pktinfo*>(CMSG_DATA(cm))->ipi6_addr, source.bytes, 16);
      used += CMSG_SPACE(sizeof(in6_pktinfo));
    }
    cm = CMSG_NXTHDR(&h, cm);
  }
  if (gso_size != 0) {
    cm->cmsg_level = SOL_UDP;
    cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    memcpy(CMSG_DATA(cm), &gso_size, sizeof(gso_size));
    used += CMSG_SPACE(sizeof(uint16_t));
  }
  h.msg_controllen = used;
}

// Segment k of a GSO send leaves with IPv4 ID k: its ICRC must cover that ID. XOR is
// its own inverse, so the same call undoes it before a fallback sends the packet alone.
void FixIcrcs(OutPacket* pkts, const GsoRuns& plan, const GsoRun& r) {
  if (r.count < 2 || pkts[r.first].to.is_v6()) return;
  // Every segment but the last is r.seg bytes: one table for the run (a length and a
  // thread-local lookup per segment were ~1 % of a rank's samples at MTU 1500).
  const uint32_t* delta = wire::IcrcIpIdDeltas(r.seg);
  uint32_t i = r.first;
  for (uint32_t k = 1; k < r.count; ++k) {
    i = plan.next(i);
    OutPacket& p = pkts[i];
    if (!p.icrc) continue;
    iovec& last = p.iov[p.iovcnt - 1];
    uint8_t* at = static_cast<uint8_t*>(last.iov_base) + last.iov_len - 4;
    uint32_t icrc;
    memcpy(&icrc, at, 4);
    const size_t bytes = k + 1 < r.count ? r.seg : PacketBytes(p);
    icrc ^= bytes == r.seg ? delta[k] : wire::IcrcIpIdDelta(bytes, k);  // the table's last use
    memcpy(at, &icrc, 4);
  }
}

}  // namespace

Status UdpTransport::SendError(int err, const OutPacket& p, size_t bytes) const {
  if (err == EMSGSIZE) {
    return IoError("a " + std::to_string(bytes) + "-byte datagram to " + ToString(p.to) +
                   " exceeds the path MTU (netreduce sets DF, so the kernel does not fragment): "
                   "the path's MTU fell after the job was admitted with a payload that fit, "
                   "or a hop has a smaller MTU than the hosts' interfaces; start "
                   "netreduce-switch with --payload-bytes at most the smallest MTU - 64 "
                   "(IPv4; MTU - 84 over IPv6), a multiple of 8 (e.g. 8936 for MTU 9000, "
                   "1432 for 1500, 1416 for 1500 over IPv6, 4096 for RoCE's 4200)");
  }
  return IoError("sendmmsg to " + ToString(p.to) + " from " + ToString(local_) + ": " +
                 strerror(err));
}

void UdpTransport::SendMessages(size_t count, size_t* sent, int* err) {
  *sent = 0;
  *err = 0;
  while (*sent < count) {
    int rc = sendmmsg(fd_, msgs_.data() + *sent, unsigned(count - *sent), 0);
    if (rc >= 0) {
      *sent += size_t(rc);
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
      pollfd pfd{fd_, POLLOUT, 0};
      poll(&pfd, 1, 10);
      continue;
    }
    if (errno == EINTR) continue;
    *err = errno;
    return;
  }
}

// A stale ICMP error on an unconnected socket: the packet (run) is lost like any
// other; retransmission repairs it.
static bool Transient(int err) {
  return err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH;
}

Status UdpTransport::SendPlain(OutPacket* pkts, size_t n) {
  const bool choose_source = local_.address().unspecified();
  size_t done = 0;
  while (done < n) {
    const size_t count = std::min<size_t>(n - done, kMaxMessages);
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
      SetControl(h, &cmsg_[i * kCmsgSpace], family_, choose_source, p, 0);
    }
    size_t sent = 0;
    int err = 0;
    SendMessages(count, &sent, &err);
    done += sent;
    if (err == 0) continue;
    if (!Transient(err)) return SendError(err, pkts[done], PacketBytes(pkts[done]));
    done += 1;
  }
  return Status::Ok();
}

Status UdpTransport::SendSegmented(OutPacket* pkts, size_t n) {
  const bool choose_source = local_.address().unspecified();
  GsoRuns& plan = gso_plan_;
  plan.Plan(pkts, n, wire::kMaxGsoSegments, kMaxGsoBytes);
  const std::vector<GsoRun>& runs = plan.runs();
  size_t done = 0;  // runs sent (or given up on)
  while (done < runs.size()) {
    const size_t count = std::min<size_t>(runs.size() - done, kMaxMessages);
    Reserve(count);
    size_t iovs = 0;
    for (size_t m = 0; m < count; ++m) {
      const GsoRun& r = runs[done + m];
      iovs += size_t(r.count) * 3;
    }
    if (run_iovs_.size() < iovs) run_iovs_.resize(iovs);
    // Joined small pieces take at most kJoinBytes per piece: sized once for the batch,
    // so that no iovec points into memory a later resize moved.
    if (run_joined_.size() < iovs * kJoinBytes) run_joined_.resize(iovs * kJoinBytes);
    uint8_t* joined = run_joined_.data();
    iovec* iov = run_iovs_.data();
    for (size_t m = 0; m < count; ++m) {
      const GsoRun& r = runs[done + m];
      const OutPacket& first = pkts[r.first];
      msghdr& h = msgs_[m].msg_hdr;
      h = msghdr{};
      socklen_t salen = 0;
      if (!ToSockaddr(first.to, family_, &addrs_[m], &salen)) {
        return IoError("cannot send to IPv6 peer " + ToString(first.to) + " from the IPv4 socket " +
                       ToString(local_) + " (bind \"::\" to serve both families)");
      }
      h.msg_name = &addrs_[m];
      h.msg_namelen = salen;
      h.msg_iov = iov;
      FixIcrcs(pkts, plan, r);  // before the trailers are copied below
      // The kernel takes a run as one byte stream and cuts it every r.seg bytes, so
      // iovec boundaries need not be datagram boundaries: one packet's trailer and
      // the next one's header leave as one iovec, copied together (kJoinBytes at
      // most each). Each iovec costs the kernel a user copy of its own: a 44-datagram
      // MTU 1500 send took ~1.7 us less with 88 iovecs than with 132 on this
      // testbed's AMD boot (no ERMS), ~2 ms of a 1 Gbit/s rank's ~76 ms per 64 MiB
      // (BENCHMARKS.md, nap1500). Copying the payloads too (one iovec per run) costs
      // more in memcpy than the kernel saves.
      iovec* open = nullptr;  // the last iovec, if it is a joined one still open
      uint32_t i = r.first;
      for (uint32_t k = 0; k < r.count; ++k) {
        const OutPacket& p = pkts[i];
        for (int j = 0; j < p.iovcnt; ++j) {
          const iovec& v = p.iov[j];
          if (v.iov_len == 0) continue;
          if (v.iov_len > kJoinBytes) {
            *iov++ = v;
            open = nullptr;
            continue;
          }
          if (open == nullptr) {  // a small piece after a large one starts a join
            open = iov++;
            *open = iovec{joined, 0};
          }
          memcpy(joined, v.iov_base, v.iov_len);
          joined += v.iov_len;
          open->iov_len += v.iov_len;
        }
        if (k + 1 < r.count) i = plan.next(i);
      }
      h.msg_iovlen = size_t(iov - static_cast<iovec*>(h.msg_iov));
      SetControl(h, &cmsg_[m * kCmsgSpace], family_, choose_source, first,
                 r.count > 1 ? uint16_t(r.seg) : 0);
    }
    size_t sent = 0;
    int err = 0;
    SendMessages(count, &sent, &err);
    const size_t begin = done, end = done + count;
    if (err == 0) {
      done = end;
      continue;
    }
    done = begin + sent;  // runs[done] failed
    const GsoRun& bad = runs[done];
    // Every run of this chunk not sent has its ICRCs fixed for a GSO send: undo that,
    // since they leave again, rebuilt (and fixed again) above or one by one.
    for (size_t m = done; m < end; ++m) FixIcrcs(pkts, plan, runs[m]);
    if (Transient(err)) {
      done += 1;
      continue;
    }
    if (bad.count > 1 && (err == EIO || err == EINVAL || err == EOPNOTSUPP)) {
      // EIO: the route's device cannot segment (no checksum offload, xfrm): plain
      // sends from now on. EINVAL: this run does not fit the path as one send (a
      // segment above the path MTU): it leaves one by one, where EMSGSIZE names the
      // limit if that is what it is.
      if (err != EINVAL) {
        std::lock_guard<std::mutex> lock(note_mu_);
        gso_note_ = std::string("a GSO send failed (") + strerror(err) + "), plain sends since";
        gso_ = false;
      }
      const size_t last = gso_ ? done + 1 : runs.size();
      for (size_t m = done; m < last; ++m) {  // the failed run, or all that is left
        uint32_t j = runs[m].first;
        for (uint32_t k = 0; k < runs[m].count; ++k) {
          Status st = SendPlain(&pkts[j], 1);
          if (!st.ok()) return st;
          if (k + 1 < runs[m].count) j = plan.next(j);
        }
      }
      done = last;
      continue;
    }
    return SendError(err, pkts[bad.first], PacketBytes(pkts[bad.first]));
  }
  return Status::Ok();
}

Status UdpTransport::SendBatch(OutPacket* pkts, size_t n) {
  return gso_ ? SendSegmented(pkts, n) : SendPlain(pkts, n);
}

}  // namespace netreduce
