// A message's send side (engine/message.h): a chunk's packet built into its slot
// tracker, queued, and the queue handed to the socket in one batch.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "engine/message.h"
#include "engine/prefetch.h"
#include "engine/repair.h"
#include "engine/rtt.h"

namespace netreduce {
using namespace engine_timing;
using namespace engine_prefetch;
using namespace engine_repair;
using namespace engine_run;

void Engine::Message::QueueSend(SlotTrack& t) {
  t.last_tx = ++tx_;  // the send queue leaves in this order (Flush: one SendBatch)
  if (e_.cfg_.drop_rate > 0.0 && coin_(e_.rng_) < e_.cfg_.drop_rate) {
    Bump(e_.dropped_by_knob_);
    return;
  }
  rs_.sendq.push_back(t.pkt);
  rs_.sendq_bytes.emplace_back();
  QueuedBytes& q = rs_.sendq_bytes.back();
  std::memcpy(q.header, t.header, sizeof(q.header));
  std::memcpy(q.trailer, t.trailer, sizeof(q.trailer));
  Bump(e_.packets_sent_);
  Bump(e_.bytes_sent_, t.pkt.iov[1].iov_len);
}

// Chunk c's header and trailer (ICRC) into slot tracker `t`: when it starts, and
// again for a resend whose group bit no longer holds (--fanout auto).
wire::Header Engine::Message::Stamp(SlotTrack& t, int64_t c, int64_t now, bool ack_req) {
  const uint64_t seq = base_ + uint64_t(c);
  const size_t first = FirstOf(c);
  wire::Header h;
  h.jumbo = e_.jumbo_;
  h.dest_qp = e_.my_qpn_;
  h.psn = uint32_t(seq & wire::kPsnMask);
  h.dtype = uint8_t(req_.dtype);
  h.op = uint8_t(req_.op);
  h.shadow = t.shadow;
  h.slot = uint16_t(t.slot);
  h.offset = first;
  h.key = e_.cfg_.key;
  h.length = OwnOf(c) ? 0 : uint32_t(ElemsOf(c) * esize_);
  h.pad = uint8_t(wire::PaddedLength(h.length) - h.length);
  h.msg_id = IdOf(c);
  h.ack_req = ack_req;
  h.udp_checksum = e_.sock_->SendsUdpChecksum();
  h.group_seen = e_.group_watch_.Fresh(now);
  wire::Encode(h, t.header);
  Endpoint& to = t.pkt.to;  // the data port that serves this slot
  to = e_.agg_;
  to.port = htons(uint16_t(e_.cfg_.port + t.lane));
  const uint8_t* payload = req_.src + first * esize_;
  if (!h.jumbo && h.length == full_bytes_) {
    wire::WriteTrailerFromSeed(h, IcrcSeedOf(t.lane), t.header, payload, t.trailer);
  } else {  // a shorter last chunk, an owner's header-only one, or no ICRC (jumbo)
    const Transport& sock = *e_.sock_;
    wire::WriteTrailer(h, sock.local().address(), to.address(), sock.local().port, to.port,
                       t.header, payload, t.trailer);
  }
  return h;
}

// The ICRC's seed of a full chunk to lane `lane`'s data port (wire::IcrcSeed), made
// for every lane when a message's chunk length differs from the last one's.
uint32_t Engine::Message::IcrcSeedOf(uint32_t lane) {
  if (rs_.icrc_seed_len != full_bytes_) {
    const Transport& sock = *e_.sock_;
    const Endpoint local = sock.local();
    const size_t pad = wire::PaddedLength(full_bytes_) - full_bytes_;
    rs_.icrc_seed.resize(e_.cfg_.threads);
    for (uint32_t l = 0; l < e_.cfg_.threads; ++l) {
      Endpoint to = e_.agg_;
      to.port = htons(uint16_t(e_.cfg_.port + l));
      rs_.icrc_seed[l] = wire::IcrcSeed(local.address(), to.address(), local.port, to.port,
                                        full_bytes_, pad);
    }
    rs_.icrc_seed_len = full_bytes_;
  }
  return rs_.icrc_seed[lane];
}

// Build chunk c's packet into slot tracker `t` and queue it.
void Engine::Message::StartChunk(SlotTrack& t, int64_t c, int64_t now) {
  const uint64_t seq = base_ + uint64_t(c);
  const uint32_t slot = t.slot;
  const size_t first = FirstOf(c);
  if (!e_.jumbo_ && c + kPrefetchAhead < nchunks_) {
    const int64_t ahead = c + kPrefetchAhead;
    PrefetchForRead(req_.src + FirstOf(ahead) * esize_, ElemsOf(ahead) * esize_);
  }
  // No round-trip estimate yet (a job's first message): ask the aggregator to say
  // when the round holds this contribution but waits for others (docs/protocol.md,
  // "Held notices"), so that waiting for a rank still starting up is not taken for
  // loss. UDP only: a verbs NIC acknowledges on its own.
  const wire::Header h = Stamp(t, c, now, !e_.cfg_.transport && e_.srtt_us_ == 0.0);
  const uint8_t* payload = req_.src + first * esize_;
  // Into its lane's order; a chunk that starts behind no older outstanding chunk of
  // its lane is at the head. Usually the newest: from the back.
  LaneOrder& order = rs_.lane_order[t.lane];
  size_t at = order.size();
  while (at > 0 && slots_[order[at - 1]].seq > seq) --at;
  t.head = at == 0;
  order.insert(at, slot);
  t.chunk = c;
  t.seq = seq;
  t.first_send_us = now;
  t.last_send_us = now;
  t.rto_us = e_.Rto();
  t.deadline_us = now + t.rto_us;
  t.retries = 0;
  t.early = false;
  t.overtaken = false;
  t.held = false;
  t.asked = false;
  t.pkt.iov[0] = {t.header, wire::kHeaderBytes};
  t.pkt.iov[1] = {const_cast<uint8_t*>(payload), h.length};
  t.pkt.iov[2] = {t.trailer, size_t(h.pad) + wire::kIcrcBytes};
  t.pkt.iovcnt = 3;
  t.pkt.segmentable = true;  // a lane's chunks of a batch: one GSO send
  t.pkt.icrc = !h.jumbo;
  // engine/repair.h; UDP only: a verbs transport's NIC (RC) or PSN checks (UC) own it.
  // (A chunk a window before the end has a successor in its own slot: not a tail.)
  const bool tail = !e_.cfg_.transport && c + int64_t(e_.window_) >= nchunks_ &&
                    IsLaneTail(c, nchunks_, base_, e_.window_, e_.cfg_.threads);
  t.probe = tail && t.head;
  if (t.probe) {
    t.early = true;
    t.deadline_us = now + TailProbeUs(e_.srtt_us_, kReorderFloorUs, t.rto_us);
    EvidenceBy(t.deadline_us);
  }
  DueBy(t.deadline_us);
  QueueSend(t);
  t.first_tx = t.last_tx;
  if (tail && CopyTail(h.length, e_.packets_sent_, e_.repaired_chunks_, e_.spurious_retransmits_)) {
    Bump(e_.tail_copies_);
    QueueSend(t);
  }
}

void Engine::Message::StartWindow() {
  const int64_t now = NowUs();
  for (auto& p : lane_progress_) p = now;
  next_due_ = now + e_.Rto();
  last_sweep_rto_ = e_.Rto();
  for (int64_t c = 0; c < std::min<int64_t>(e_.window_, nchunks_); ++c) {
    const uint64_t seq = base_ + uint64_t(c);
    SlotTrack& t = slots_[seq % e_.window_];
    t.shadow = uint8_t((seq / e_.window_) & 1);
    StartChunk(t, c, now);
  }
}

Status Engine::Message::Flush() {
  std::vector<OutPacket>& sendq = rs_.sendq;
  if (sendq.empty()) return Status::Ok();
  for (size_t i = 0; i < sendq.size(); ++i) {
    sendq[i].iov[0].iov_base = rs_.sendq_bytes[i].header;
    sendq[i].iov[2].iov_base = rs_.sendq_bytes[i].trailer;
  }
  NR_RETURN_IF_ERROR(e_.sock_->SendBatch(sendq.data(), sendq.size()));
  sendq.clear();
  rs_.sendq_bytes.clear();
  return Status::Ok();
}

}  // namespace netreduce
