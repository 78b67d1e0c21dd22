// RC verbs peers: the aggregator as the responder of the worker's requests and the
// requester of its results (docs/protocol.md, "Verbs peers").
//
// Responder: requests (RC RDMA WRITE Only with Immediate) are taken in PSN order.
// The expected PSN is accepted and moves the expected PSN and the MSN on; the
// requests taken in one receive batch are acknowledged together, by one ACK (BTH +
// AETH with the MSN) for the last of them, as a responder may coalesce; a duplicate (a PSN
// already taken: the worker's NIC resent it because an ACK was lost) is
// acknowledged again and not executed; a PSN ahead of the expected one gets one
// NAK (PSN sequence error, naming the expected PSN) per gap, after which the NIC
// resends from there. Accepted requests go on to the slot path like UC ones.
// Requester: every result asks for an ACK and is kept until one covers its PSN; an
// ACK drops what it covers, a sequence NAK resends from the PSN it names
// (go-back-N), and results unacknowledged for kRcTimeoutUs are resent. The engine's
// own retransmission stays as the last resort (a new request, answered with a new
// result), so a peer the aggregator gave up on still completes.
#include <arpa/inet.h>

#include <chrono>
#include <cstring>

#include "aggregator/aggregator.h"
#include "aggregator/verbs_peer.h"
#include "transport/verbs/verbs_wire.h"

namespace netreduce {
namespace {

constexpr int64_t kRcTimeoutUs = 200000;  // results unacknowledged this long are resent
constexpr size_t kMaxUnacked = 4096;      // kept per QP; beyond, results go unremembered
constexpr uint8_t kAethAck = 0x1F;        // ACK, credit field "invalid" (no end-to-end credits)
constexpr uint8_t kAethNakSeq = 0x60;     // NAK, PSN sequence error
constexpr size_t kAckBytes = wire::kBthBytes + 4;

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
uint32_t Get24(const uint8_t* p) { return (uint32_t(p[0]) << 16) | (uint32_t(p[1]) << 8) | p[2]; }
void Put24(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 16);
  p[1] = uint8_t(v >> 8);
  p[2] = uint8_t(v);
}
// a - b in PSN space: >= 0 when a is b or after it (within half the 24-bit space).
int32_t PsnDiff(uint32_t a, uint32_t b) {
  uint32_t d = (a - b) & wire::kPsnMask;
  return d & 0x800000 ? int32_t(d) - 0x1000000 : int32_t(d);
}

}  // namespace

void RememberUnacked(VerbsPeer& peer, const OutPacket& p) {
  VerbsRcState& rc = peer.rc;
  // Past the bound the newest go unremembered (the engine's backstop covers them):
  // dropping old entries here could free one a queued resend still points into.
  if (rc.unacked.size() >= kMaxUnacked) return;
  VerbsRcState::Unacked u;
  const uint8_t* head = static_cast<const uint8_t*>(p.iov[0].iov_base);
  u.psn = Get24(head + 9);
  u.sent_us = NowUs();
  for (int i = 0; i < p.iovcnt; ++i) {
    const uint8_t* b = static_cast<const uint8_t*>(p.iov[i].iov_base);
    u.pkt.insert(u.pkt.end(), b, b + p.iov[i].iov_len);
  }
  rc.unacked.push_back(std::move(u));
}

static void QueueAck(Job& job, VerbsPeer& peer, uint8_t syndrome, uint32_t psn, uint16_t my_port,
                     uint32_t local_ip, ResultBatch& out) {
  if (out.full()) out.Flush();
  const size_t k = out.pkts.size();
  uint8_t* head = &out.verbs_heads[k * kVerbsResultHeadBytes];
  uint8_t* trailer = &out.trailers[k * 8];
  std::memset(head, 0, kAckBytes);
  head[0] = kOpcodeRcAck;
  head[2] = head[3] = 0xFF;  // P_Key
  Put24(head + 5, peer.info.qpn);
  Put24(head + 9, psn & wire::kPsnMask);
  head[12] = syndrome;
  Put24(head + 13, peer.rc.msn & wire::kPsnMask);
  const uint32_t icrc = VerbsIcrc(local_ip, peer.info.ip, my_port, htons(verbs_wire::kRoceV2Port),
                                  head, kAckBytes, nullptr, 0, 0);
  std::memcpy(trailer, &icrc, 4);
  OutPacket p;
  p.to = Endpoint{peer.info.ip, htons(verbs_wire::kRoceV2Port)};
  p.from_ip = local_ip;
  p.iov[0] = {head, kAckBytes};
  p.iov[1] = {trailer, wire::kIcrcBytes};
  p.iovcnt = 2;
  out.pkts.push_back(p);
  (void)job;
}

static void Resend(VerbsPeer& peer, VerbsRcState::Unacked& u, uint32_t local_ip, ResultBatch& out) {
  if (out.full()) out.Flush();
  OutPacket p;
  p.to = Endpoint{peer.info.ip, htons(verbs_wire::kRoceV2Port)};
  p.from_ip = local_ip;
  p.iov[0] = {u.pkt.data(), u.pkt.size()};
  p.iovcnt = 1;
  out.pkts.push_back(p);
  u.sent_us = NowUs();
  peer.rc.retransmits++;
}

bool Aggregator::HandleVerbsRc(const InPacket& pkt, uint16_t my_port, ResultBatch& out) {
  const uint32_t qpn = Get24(pkt.buf + 5);
  Job* jp = JobFor(out.thread, wire::QpnJob(qpn));
  const uint32_t rank = wire::QpnRank(qpn);
  if (jp == nullptr || !jp->verbs.Active(rank) || !jp->verbs.peer(rank).info.rc) return false;
  Job& job = *jp;
  VerbsPeer& peer = job.verbs.peer(rank);
  VerbsRcState& rc = peer.rc;
  const uint32_t psn = Get24(pkt.buf + 9);
  const uint32_t local_ip = pkt.local_ip;
  if (pkt.buf[0] == kOpcodeRcAck) {
    if (pkt.len < kAckBytes + wire::kIcrcBytes) return true;
    const uint8_t syndrome = pkt.buf[12];
    // Nothing queued may point into entries about to be dropped.
    out.Flush();
    const bool nak_seq = (syndrome & 0xE0) == 0x60 && (syndrome & 0x1F) == 0;
    const bool ack = (syndrome & 0xE0) == 0;
    // An ACK covers its PSN; a sequence NAK covers the PSNs before the one it names.
    while (!rc.unacked.empty() &&
           (ack ? PsnDiff(psn, rc.unacked.front().psn) >= 0
                : nak_seq && PsnDiff(psn, rc.unacked.front().psn) > 0)) {
      rc.unacked.pop_front();
    }
    if (nak_seq) {
      for (auto& u : rc.unacked) Resend(peer, u, local_ip, out);
    }
    return true;  // RNR NAKs and other NAKs: the timer resends
  }
  // A request.
  const int32_t d = PsnDiff(psn, rc.expect_psn);
  const bool ack_req = (pkt.buf[8] & wire::kAckReqBit) != 0;
  if (d == 0) {
    rc.expect_psn = (rc.expect_psn + 1) & wire::kPsnMask;
    rc.msn = (rc.msn + 1) & wire::kPsnMask;
    rc.nak_sent = false;
    if (ack_req) {  // acknowledged after the batch (VerbsTimers), one ACK for all
      rc.ack_due = true;
      rc.ack_psn = psn;
    }
    pkt.buf[0] = wire::kOpcodeUcWriteOnlyImm;  // the slot path parses the UC layout
    return false;
  }
  if (d < 0) {  // a duplicate: acknowledge again, do not execute
    QueueAck(job, peer, kAethAck, (rc.expect_psn - 1) & wire::kPsnMask, my_port, local_ip, out);
  } else if (!rc.nak_sent) {
    rc.nak_sent = true;
    QueueAck(job, peer, kAethNakSeq, rc.expect_psn, my_port, local_ip, out);
  }
  return true;
}

void Aggregator::VerbsTimers(uint16_t my_port, ResultBatch& out) {
  std::unique_lock<std::mutex> lock(verbs_mu_, std::try_to_lock);
  if (!lock.owns_lock() || rc_peers_.empty()) return;
  const int64_t now = NowUs();
  for (size_t i = 0; i < rc_peers_.size();) {
    std::shared_ptr<Job> job = rc_peers_[i].first.lock();
    if (!job) {  // the job is gone
      rc_peers_[i] = rc_peers_.back();
      rc_peers_.pop_back();
      continue;
    }
    const uint32_t rank = rc_peers_[i].second;
    VerbsPeer& peer = job->verbs.peer(rank);
    ++i;
    const uint32_t local_ip = job->ranks[rank].local_ip.load(std::memory_order_relaxed);
    if (peer.rc.ack_due) {
      peer.rc.ack_due = false;
      QueueAck(*job, peer, kAethAck, peer.rc.ack_psn, my_port, local_ip, out);
    }
    auto& q = peer.rc.unacked;
    if (q.empty() || now - q.front().sent_us < kRcTimeoutUs) continue;
    for (auto& u : q) Resend(peer, u, local_ip, out);
  }
}

}  // namespace netreduce
