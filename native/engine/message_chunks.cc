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
    e_.dropped_by_knob_++;
    return;
  }
  rs_.sendq.emplace_back();
  Queued& q = rs_.sendq.back();
  std::memcpy(q.header, t.header, sizeof(q.header));
  std::memcpy(q.trailer, t.trailer, sizeof(q.trailer));
  q.pkt = t.pkt;
  e_.packets_sent_++;
  e_.bytes_sent_ += t.pkt.iov[1].iov_len;
}

// Chunk c's header and trailer (ICRC) into slot tracker `t`: when it starts, and
// again for a resend whose group bit no longer holds (--fanout auto).
wire::Header Engine::Message::Stamp(SlotTrack& t, int64_t c, int64_t now, bool ack_req) {
  const uint64_t seq = base_ + uint64_t(c);
  const uint32_t slot = uint32_t(seq % e_.window_);
  const size_t first = FirstOf(c);
  wire::Header h;
  h.jumbo = e_.jumbo_;
  h.dest_qp = e_.my_qpn_;
  h.psn = uint32_t(seq & wire::kPsnMask);
  h.dtype = uint8_t(req_.dtype);
  h.op = uint8_t(req_.op);
  h.shadow = uint8_t((seq / e_.window_) & 1);
  h.slot = uint16_t(slot);
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
  to.port = htons(uint16_t(e_.cfg_.port + slot % e_.cfg_.threads));
  const Transport& sock = *e_.sock_;
  wire::WriteTrailer(h, sock.local().address(), to.address(), sock.local().port, to.port, t.header,
                     req_.src + first * esize_, t.trailer);
  return h;
}

// Build chunk c's packet into slot tracker `t` and queue it.
void Engine::Message::StartChunk(SlotTrack& t, int64_t c, int64_t now) {
  const uint64_t seq = base_ + uint64_t(c);
  const uint32_t slot = uint32_t(seq % e_.window_);
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
  std::deque<uint32_t>& order = rs_.lane_order[t.lane];
  auto at = order.end();
  while (at != order.begin() && slots_[*(at - 1)].seq > seq) --at;
  t.head = at == order.begin();
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
  t.pkt.iov[0] = {t.header, wire::kHeaderBytes};
  t.pkt.iov[1] = {const_cast<uint8_t*>(payload), h.length};
  t.pkt.iov[2] = {t.trailer, size_t(h.pad) + wire::kIcrcBytes};
  t.pkt.iovcnt = 3;
  t.pkt.segmentable = true;  // a lane's chunks of a batch: one GSO send
  t.pkt.icrc = !h.jumbo;
  // engine/repair.h; UDP only: a verbs transport's NIC (RC) or PSN checks (UC) own it.
  const bool tail = !e_.cfg_.transport && IsLaneTail(c, nchunks_, base_, e_.window_, e_.cfg_.threads);
  t.probe = tail && t.head;
  if (t.probe) t.early = true, t.deadline_us = now + TailProbeUs(e_.srtt_us_, kReorderFloorUs, t.rto_us);
  DueBy(t.deadline_us);
  QueueSend(t);
  t.first_tx = t.last_tx;
  if (tail && CopyTail(h.length, e_.packets_sent_, e_.repaired_chunks_, e_.spurious_retransmits_)) {
    e_.tail_copies_++;
    QueueSend(t);
  }
}

void Engine::Message::StartWindow() {
  const int64_t now = NowUs();
  for (auto& p : lane_progress_) p = now;
  next_due_ = now + e_.Rto();
  last_sweep_rto_ = e_.Rto();
  for (int64_t c = 0; c < std::min<int64_t>(e_.window_, nchunks_); ++c) {
    StartChunk(slots_[(base_ + uint64_t(c)) % e_.window_], c, now);
  }
}

Status Engine::Message::Flush() {
  std::vector<Queued>& sendq = rs_.sendq;
  if (sendq.empty()) return Status::Ok();
  std::vector<OutPacket>& batch = rs_.batch;
  batch.clear();
  for (Queued& q : sendq) {
    batch.push_back(q.pkt);
    batch.back().iov[0].iov_base = q.header;
    batch.back().iov[2].iov_base = q.trailer;
  }
  NR_RETURN_IF_ERROR(e_.sock_->SendBatch(batch.data(), batch.size()));
  sendq.clear();  // only now: the batch points into the queue's headers and trailers
  return Status::Ok();
}

}  // namespace netreduce
