// The engine loop.
//
// A message of `count` elements is cut into chunks of P / accumulator-width
// elements. Chunk c gets the sequence number seq = base + c; it travels in slot
// seq % W with shadow bit (seq / W) % 2 and PSN seq mod 2^24. Sequence numbers run on
// across messages, so consecutive messages never meet the same (slot, shadow) round.
// Self-clocking: at most one chunk per slot is outstanding; when a slot's result
// arrives, the result is copied into place and the chunk W further on is sent in
// the same slot. A resend is always the very same packet, and always safe: the
// aggregator adds a contribution once.
//
// Loss recovery: engine/repair.h (the rules, and where each hooks into Run).
// A chunk without a result for timeout_s fails the operation, naming the aggregator,
// job, rank and slot. After a failure the engine's sequence is out of step with the
// job, so it refuses further work.
#include "engine/engine.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>

#include "engine/prefetch.h"
#include "engine/repair.h"
#include "engine/run_state.h"
#include "engine/rtt.h"
#include "wire/roce.h"

namespace netreduce {
using namespace engine_timing;
using namespace engine_prefetch;
using namespace engine_repair;
using namespace engine_run;
namespace {

// Submit's owner for a reduce-scatter laid out chunk-interleaved: chunk c's owner is
// rank c mod N, so every window carries every rank's data (docs/protocol.md).
constexpr int32_t kInterleavedOwners = -2;

// The sweep over every outstanding chunk (timeouts, the next wake-up) runs when the
// earliest deadline may have come (next_due, a lower bound kept as deadlines are set),
// or when the RTO estimate fell below the one the last sweep used: lane timeouts are
// lane_progress + RTO, so only a falling RTO moves a due time earlier than next_due.
// No periodic wake-up: a job of 1,000 ranks waiting on its slowest rank has 1,000
// engines in Run, and a wake-up every 2 ms each was 500,000 a second.

}  // namespace

Status Engine::Run(Request& req) {
  if (!ValidDType(uint8_t(req.dtype)) || !ValidOp(uint8_t(req.op))) {
    return InvalidArgument("unknown dtype or op code");
  }
  if (req.count == 0) return Status::Ok();
  const size_t esize = ElementSize(req.dtype);
  const size_t chunk_elems = cfg_.payload_bytes / AccumSize(req.dtype);
  const int64_t nchunks = int64_t((req.count + chunk_elems - 1) / chunk_elems);
  if (req.count - 1 > wire::kMaxOffset) {
    return InvalidArgument("message of " + std::to_string(req.count) +
                           " elements exceeds the 2^40-element offset field");
  }
  if (uint64_t(nchunks) > sock_->MaxMessageChunks()) {
    return InvalidArgument("message of " + std::to_string(nchunks) + " chunks exceeds the " +
                           std::to_string(sock_->MaxMessageChunks()) + " this transport carries");
  }
  if (req.owner >= int32_t(cfg_.size)) {
    return InvalidArgument("reduce-scatter owner " + std::to_string(req.owner) +
                           " is not a rank of a job of " + std::to_string(cfg_.size));
  }
  // Owner delivery: non-owners expect header-only notices (DMA length 0).
  const uint32_t counter = next_msg_++;
  // Each chunk's owner: the message's, or rank c mod N when interleaved; -1 none.
  const bool interleaved = req.owner == kInterleavedOwners;
  auto owner_of = [&](int64_t c) -> int32_t {
    return interleaved ? (cfg_.size > 1 ? int32_t(uint64_t(c) % cfg_.size) : -1) : req.owner;
  };
  auto id_of = [&](int64_t c) -> uint32_t {
    const int32_t o = owner_of(c);
    return o >= 0 ? wire::MakeOwnerMsgId(counter, uint32_t(o)) : (counter & ~wire::kOwnerFlag);
  };
  // Owner delivery: non-owners expect header-only notices (DMA length 0) ...
  auto notice_of = [&](int64_t c) {
    const int32_t o = owner_of(c);
    return o >= 0 && uint32_t(o) != cfg_.rank;
  };
  // ... and the owner sends headers only for its own chunks (the slot counts them) and
  // combines its own data with the others' sum on arrival: (N-1)/N of the buffer out.
  auto own_of = [&](int64_t c) {
    const int32_t o = owner_of(c);
    return o >= 0 && uint32_t(o) == cfg_.rank && cfg_.size > 1;
  };
  // Results of a large message with large chunks go into dst by streaming stores
  // (prefetch.h); 1432-byte chunks do better with plain stores and dst prefetched.
  const bool stream = req.count * esize >= kStreamMinBytes && chunk_elems * esize >= kStreamMinChunk;
  const uint64_t base = next_seq_;
  next_seq_ += uint64_t(nchunks);
  messages_++;

  RunState& rs = *run_;
  std::vector<SlotTrack>& slots = rs.slots;
  if (!rs.clean) {  // a failed message left chunks behind (the engine refuses work after
    for (SlotTrack& t : slots) t.chunk = -1;  // one, but Run must not trust stale state)
    for (auto& q : rs.lane_order) q.clear();
  }
  rs.clean = false;
  std::vector<Queued>& sendq = rs.sendq;
  std::vector<OutPacket>& batch = rs.batch;
  sendq.clear();
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  // The first timeout of a chunk follows the measured round trip (Rto()). Under CPU
  // contention a round trip on loopback can take tens of ms (queues of N workers'
  // windows at the aggregator, and the slowest rank sets the pace): rttvar and the
  // spurious-resend samples raise it then, and the stall rule below keeps what
  // fires anyway to one packet per backed-off timeout.
  const int64_t timeout_us = int64_t(cfg_.timeout_s * 1e6);
  const uint64_t retransmits_at_start = retransmits_;  // the timeout error counts this operation's
  // Per lane: last completion (progress), its chunk, no timeout probe before next_probe.
  std::vector<int64_t> lane_progress(cfg_.threads, 0), next_probe(cfg_.threads, 0);
  std::vector<int64_t> lane_last_seq(cfg_.threads, -1);
  int64_t remaining = nchunks;
  // A lower bound of the earliest deadline of any outstanding chunk (see the sweep, below).
  int64_t next_due = 0;
  auto due_by = [&](int64_t at) { next_due = std::min(next_due, at); };

  auto queue_send = [&](SlotTrack& t) {
    if (cfg_.drop_rate > 0.0 && coin(rng_) < cfg_.drop_rate) {
      dropped_by_knob_++;
      return;
    }
    sendq.emplace_back();
    Queued& q = sendq.back();
    std::memcpy(q.header, t.header, sizeof(q.header));
    std::memcpy(q.trailer, t.trailer, sizeof(q.trailer));
    q.pkt = t.pkt;
    packets_sent_++;
    bytes_sent_ += t.pkt.iov[1].iov_len;
  };

  // Chunk c's header and trailer (ICRC) into slot tracker `t`: when it starts, and
  // again for a resend whose group bit no longer holds (--fanout auto).
  auto stamp = [&](SlotTrack& t, int64_t c, int64_t now, bool ack_req) {
    const uint64_t seq = base + uint64_t(c);
    const uint32_t slot = uint32_t(seq % window_);
    const size_t first = size_t(c) * chunk_elems;
    const size_t n = std::min(chunk_elems, req.count - first);
    wire::Header h;
    h.jumbo = jumbo_;
    h.dest_qp = my_qpn_;
    h.psn = uint32_t(seq & wire::kPsnMask);
    h.dtype = uint8_t(req.dtype);
    h.op = uint8_t(req.op);
    h.shadow = uint8_t((seq / window_) & 1);
    h.slot = uint16_t(slot);
    h.offset = first;
    h.key = cfg_.key;
    h.length = own_of(c) ? 0 : uint32_t(n * esize);
    h.pad = uint8_t(wire::PaddedLength(h.length) - h.length);
    h.msg_id = id_of(c);
    h.ack_req = ack_req;
    h.udp_checksum = sock_->SendsUdpChecksum();
    h.group_seen = group_watch_.Fresh(now);
    wire::Encode(h, t.header);
    Endpoint& to = t.pkt.to;  // the data port that serves this slot
    to = agg_;
    to.port = htons(uint16_t(cfg_.port + slot % cfg_.threads));
    wire::WriteTrailer(h, sock_->local().address(), to.address(), sock_->local().port, to.port,
                       t.header, req.src + first * esize, t.trailer);
    return h;
  };

  // Build chunk c's packet into slot tracker `t` and queue it.
  auto start_chunk = [&](SlotTrack& t, int64_t c, int64_t now) {
    const uint64_t seq = base + uint64_t(c);
    const uint32_t slot = uint32_t(seq % window_);
    const size_t first = size_t(c) * chunk_elems;
    if (!jumbo_ && c + kPrefetchAhead < nchunks) {
      const size_t ahead = first + kPrefetchAhead * chunk_elems;
      PrefetchForRead(req.src + ahead * esize, std::min(chunk_elems, req.count - ahead) * esize);
    }
    // No round-trip estimate yet (a job's first message): ask the aggregator to say
    // when the round holds this contribution but waits for others (docs/protocol.md,
    // "Held notices"), so that waiting for a rank still starting up is not taken for
    // loss. UDP only: a verbs NIC acknowledges on its own.
    const wire::Header h = stamp(t, c, now, !cfg_.transport && srtt_us_ == 0.0);
    const uint8_t* payload = req.src + first * esize;
    // Into its lane's order; a chunk that starts behind no older outstanding chunk of
    // its lane is at the head. Usually the newest: from the back.
    std::deque<uint32_t>& order = rs.lane_order[t.lane];
    auto at = order.end();
    while (at != order.begin() && slots[*(at - 1)].seq > seq) --at;
    t.head = at == order.begin();
    order.insert(at, slot);
    t.chunk = c;
    t.seq = seq;
    t.first_send_us = now;
    t.last_send_us = now;
    t.rto_us = Rto();
    t.deadline_us = now + t.rto_us;
    t.retries = 0;
    t.early = false;
    t.held = false;
    t.pkt.iov[0] = {t.header, wire::kHeaderBytes};
    t.pkt.iov[1] = {const_cast<uint8_t*>(payload), h.length};
    t.pkt.iov[2] = {t.trailer, size_t(h.pad) + wire::kIcrcBytes};
    t.pkt.iovcnt = 3;
    t.pkt.segmentable = true;  // a lane's chunks of a batch: one GSO send
    t.pkt.icrc = !h.jumbo;
    // engine/repair.h; UDP only: a verbs transport's NIC (RC) or PSN checks (UC) own it.
    const bool tail = !cfg_.transport && IsLaneTail(c, nchunks, base, window_, cfg_.threads);
    t.probe = tail && t.head;
    if (t.probe) t.early = true, t.deadline_us = now + TailProbeUs(srtt_us_, kReorderFloorUs, t.rto_us);
    due_by(t.deadline_us);
    queue_send(t);
    if (tail && CopyTail(h.length, packets_sent_, repaired_chunks_, spurious_retransmits_)) {
      tail_copies_++;
      queue_send(t);
    }
  };

  int64_t now = NowUs();
  for (auto& p : lane_progress) p = now;
  next_due = now + Rto();
  int64_t last_sweep_rto = Rto();
  for (int64_t c = 0; c < std::min<int64_t>(window_, nchunks); ++c) {
    start_chunk(slots[(base + uint64_t(c)) % window_], c, now);
  }

  std::vector<SlotTrack*> probes(cfg_.threads, nullptr), held_probes(cfg_.threads, nullptr);
  bool first_of_batch = true;
  int64_t rx_now = 0;  // when the results being handled were received
  uint8_t* const storage = rs.storage.get();
  std::vector<InPacket>& in = rs.in;
  uint8_t peek[wire::kHeaderBytes];
  uint8_t trailer[8];

  while (remaining > 0) {
    if (!sendq.empty()) {
      batch.clear();
      for (Queued& q : sendq) {
        batch.push_back(q.pkt);
        batch.back().iov[0].iov_base = q.header;
        batch.back().iov[2].iov_base = q.trailer;
      }
      NR_RETURN_IF_ERROR(sock_->SendBatch(batch.data(), batch.size()));
      sendq.clear();
    }
    if (aborted_) {
      std::lock_guard<std::mutex> lock(mu_);
      return Aborted(abort_reason_);
    }
    now = NowUs();
    const int64_t rto = Rto();
    const int64_t wait_us =
        std::min<int64_t>(50000, std::max<int64_t>(0, (rto < last_sweep_rto ? now : next_due) - now));
    // The chunk outstanding in the result's slot, if the result is for it.
    auto match = [&](const wire::Header& h) -> SlotTrack* {
      if (!h.result || (h.dest_qp != my_qpn_ && h.dest_qp != group_qpn_) || h.key != cfg_.key ||
          h.slot >= window_) {
        return nullptr;
      }
      SlotTrack& t = slots[h.slot];
      if (t.chunk < 0 || h.msg_id != id_of(t.chunk)) return nullptr;
      const size_t first = size_t(t.chunk) * chunk_elems;
      const size_t expect = notice_of(t.chunk) ? 0 : std::min(chunk_elems, req.count - first) * esize;
      if (h.psn != (t.seq & wire::kPsnMask) || h.offset != first || h.length != expect) {
        return nullptr;  // a duplicate or late result for a chunk already done
      }
      return &t;
    };
    // A held notice (wire::kExtHeld) for the chunk outstanding in its slot: the round
    // has this rank's contribution and waits for others. Its round trip is the path's
    // alone, the one sample a first message can give without the others' lag.
    auto held_notice = [&](const wire::Header& h) {
      if (h.dest_qp != my_qpn_ || h.key != cfg_.key || h.slot >= window_ || h.length != 0) {
        ignored_results_++;
        return;
      }
      SlotTrack& t = slots[h.slot];
      if (t.chunk < 0 || h.msg_id != id_of(t.chunk) || h.psn != (t.seq & wire::kPsnMask) ||
          h.offset != size_t(t.chunk) * chunk_elems) {
        return;  // for a chunk already done (its result came first)
      }
      held_notices_++;
      const int64_t t_now = rx_now;
      if (!t.held) {
        if (t.retries == 0 && t.head) SampleRtt(double(t_now - t.first_send_us));
        t.rto_us = kHeldProbeUs;  // from now on the held probe's interval
      }
      t.held = true;
      t.early = t.probe = false;
      t.deadline_us = t_now + t.rto_us;
      lane_progress[t.lane] = t_now;  // the path answers: no timeout probe yet
    };
    // A result that matches no outstanding chunk. A second result for a chunk that
    // completed after a retransmission means the aggregator answered both sends: the
    // first result answered the original, which was only slow (a rank stalled, a
    // queue), not lost. Karn's rule hides exactly those long round trips from the
    // estimator, so without this the timeout never learns them and keeps firing;
    // feed the round trip of the original in (TCP's Eifel detection, in spirit).
    // The record survives the message: the second result of a message's last chunks
    // arrives while the next message runs.
    auto late_result = [&](const wire::Header& h) {
      ignored_results_++;
      if (!h.result || (h.dest_qp != my_qpn_ && h.dest_qp != group_qpn_) || h.key != cfg_.key ||
          h.slot >= window_) {
        return;
      }
      Retried& r = retried_[h.slot];
      if (r.sample_us >= 0 && h.msg_id == r.msg_id && h.psn == r.psn) {
        if (r.head) SampleRtt(double(r.sample_us));
        r.sample_us = -1;
        spurious_retransmits_++;
      }
    };
    // The result of `t` is in place: sample the round trip, give chunks it overtook
    // their reorder deadline, move the slot on. `repeat_seen`: the aggregator had
    // this rank's contribution before a repeat of it arrived (kExtRepeatSeen).
    auto complete = [&](SlotTrack& t, bool repeat_seen) {
      packets_received_++;
      const int64_t t_now = rx_now;
      const size_t lane = t.lane;
      // An inter-result gap: t was already on its way when the lane's previous result
      // came. Only the first result of a receive batch: those behind it in the same
      // batch waited in the socket, their spacing is the engine's, not the path's.
      if (first_of_batch && !t.held && lane_last_seq[lane] >= 0 &&
          t.seq > uint64_t(lane_last_seq[lane]) && t.last_send_us <= lane_progress[lane]) {
        SampleGap(double(t_now - lane_progress[lane]));
      }
      first_of_batch = false;
      lane_progress[lane] = t_now;
      // Progress ends a lane's probe back-off, as an ACK ends TCP's: the doubling is for
      // a lane that hears nothing. Kept after progress, a needless probe (its round waits
      // for another rank) held the lane's next probe back up to 1 s, and a tail of many
      // rounds each missing one rank's contribution was repaired at ~17 rounds a second.
      next_probe[lane] = 0;
      lane_last_seq[lane] = int64_t(t.seq);
      Retried& r = retried_[t.seq % window_];
      if (t.retries > 0) repaired_chunks_++, repair_wait_us_ += uint64_t(t_now - t.first_send_us);
      // A chunk whose resend the aggregator saw as a repeat was not lost: the slot was
      // waiting for another rank (its loss, or a descheduled process). Proven needless
      // once per chunk, like a second result below (so the record is not kept), so
      // that only this rank's own losses switch tail copies on. No round-trip sample:
      // the wait was the slot's, not the path's.
      const bool proven = t.retries > 0 && repeat_seen;
      if (proven) spurious_retransmits_++, needless_by_repeat_++;
      if (t.retries == 0 || proven) {  // Karn: only unambiguous samples
        // (a held chunk's round trip is the wait for the others; its notice sampled)
        if (!proven && t.head && !t.held) SampleRtt(double(t_now - t.first_send_us));
        r.sample_us = -1;
      } else {
        r.head = t.head && !t.held;  // a held chunk's first send waited for the others
        r.msg_id = id_of(t.chunk);
        r.psn = uint32_t(t.seq & wire::kPsnMask);
        r.sample_us = t_now - t.first_send_us;
      }
      // Overtaken: only chunks of t's lane, sent no later than t was last sent (a
      // chunk resent since had its own chance). Next expected: the lane's oldest chunk
      // after t, once it has been out for the least round trip seen.
      const int64_t reorder_us = std::max<int64_t>(kReorderFloorUs, int64_t(srtt_us_ / 4));
      std::deque<uint32_t>& order = rs.lane_order[lane];
      const uint32_t mine = uint32_t(&t - slots.data());
      size_t pos = 0;  // t's place in its lane: usually the front (results in order)
      while (order[pos] != mine) ++pos;
      for (size_t k = 0; k < pos; ++k) {  // older chunks of the lane: overtaken
        SlotTrack& o = slots[order[k]];
        if (o.early || o.last_send_us > t.last_send_us) continue;
        // A held chunk too: its round held this rank's contribution, and a later round
        // of the lane has completed, so its own result was most likely lost (or another
        // rank's contribution, which that rank repairs). It leaves the held state and
        // is repaired like any overtaken chunk -- the held probe asks for one chunk per
        // lane a second, and a burst of lost held results took minutes.
        if (o.held) o.held = false, o.rto_us = Rto();
        o.early = true;
        o.deadline_us = std::min(o.deadline_us, t_now + reorder_us);
        due_by(o.deadline_us);
      }
      const size_t later = order.size() - pos - 1;  // outstanding chunks of the lane after t
      SlotTrack* expected = later > 0 ? &slots[order[pos + 1]] : nullptr;
      if (pos == 0) order.pop_front();  // the usual case, without deque's general erase
      else order.erase(order.begin() + long(pos));
      // Only for the lane's last outstanding chunk: any other is covered when a later
      // one is answered, and a gap deadline on every chunk of a long window misfired
      // whenever the loaded host descheduled the aggregator for a few gaps.
      if (expected != nullptr && later == 1 && !expected->early && !expected->held) {
        expected->early = true;
        expected->deadline_us =
            std::min(expected->deadline_us,
                     std::max(t_now + GapTimeout(), expected->last_send_us + min_rtt_us_));
        due_by(expected->deadline_us);
      }
      --remaining;
      const int64_t next = t.chunk + int64_t(window_);
      if (next < nchunks) {
        start_chunk(t, next, t_now);
      } else {
        t.chunk = -1;
      }
    };

    // The multicast group's bookkeeping (--fanout auto; group_watch.h).
    auto group_heard = [&](int64_t at, uint64_t n) { group_watch_.Heard(at), group_datagrams_ += n; };
    auto unicast_result = [&](const Transport& sock, int64_t at) {
      if (group_ && &sock != group_.get()) group_watch_.UnicastResult(at, Rto());
    };
    // Drain what one socket (unicast, or the job's multicast group) holds.
    auto drain = [&](Transport& sock) -> Status {
      first_of_batch = true;
      const bool own_buffers = sock.OwnsReceiveBuffers();  // GRO: batches only
      if (jumbo_ && !own_buffers) {
        // Zero-copy path: peek at the header, then receive the payload straight into
        // its place in the destination buffer.
        for (size_t k = 0; k < kRecvBatch; ++k) {
          size_t len = 0;
          Endpoint from;
          NR_RETURN_IF_ERROR(sock.PeekHeader(peek, wire::kHeaderBytes, 0, &len, &from));
          if (len == 0) break;
          rx_now = NowUs();
          if (&sock == group_.get()) group_heard(rx_now, 1);
          wire::Header h;
          SlotTrack* t = nullptr;
          const bool ours = len <= kRecvBufBytes &&
                            wire::Decode(peek, len, &h) == wire::DecodeError::kOk && h.jumbo;
          if (ours && h.held) {
            iovec iov = {storage, kRecvBufBytes};
            size_t got_len = 0;
            NR_RETURN_IF_ERROR(sock.RecvScatter(&iov, 1, &got_len));
            held_notice(h);
            continue;
          }
          if (ours) t = match(h);
          size_t got_len = 0;
          if (t != nullptr) {
            // An owner's own shard lands in scratch first: its place holds the rank's
            // own contribution, which the others' sum is combined with.
            const size_t at = size_t(t->chunk) * chunk_elems * esize;
            const bool own = own_of(t->chunk);
            uint8_t* into = own ? storage : req.dst + at;
            iovec iov[3] = {{peek, wire::kHeaderBytes},
                            {into, h.length},
                            {trailer, size_t(h.pad) + wire::kIcrcBytes}};
            NR_RETURN_IF_ERROR(sock.RecvScatter(iov, 3, &got_len));
            if (own) {
              CombineInto(req.dtype, req.op, req.dst + at, req.src + at, into, h.length / esize);
            }
            unicast_result(sock, rx_now);
            complete(*t, h.repeat_seen);
          } else {
            iovec iov = {storage, kRecvBufBytes};
            NR_RETURN_IF_ERROR(sock.RecvScatter(&iov, 1, &got_len));
            if (ours) {
              late_result(h);
            } else {
              ignored_results_++;
            }
          }
        }
        return Status::Ok();
      }
      if (!own_buffers) {
        for (size_t i = 0; i < kRecvBatch; ++i) {
          in[i].buf = storage + i * kRecvBufBytes;
          in[i].cap = kRecvBufBytes;
        }
      }
      size_t got = 0;
      NR_RETURN_IF_ERROR(sock.RecvBatch(in.data(), own_buffers ? kRecvDescriptors : kRecvBatch, 0, &got));
      // One clock read for the batch: its results were all in by now (a vDSO call per
      // result was about a tenth of the engine's CPU at MTU 1500).
      if (got > 0) rx_now = NowUs();
      if (got > 0 && &sock == group_.get()) group_heard(rx_now, got);
      for (size_t i = 0; i < got; ++i) {
        InPacket& p = in[i];
        wire::Header h;
        if (p.len > kRecvBufBytes || wire::Decode(p.buf, p.len, &h) != wire::DecodeError::kOk ||
            (!p.verified && wire::IcrcCheckNeeded(h, p.kernel_checked, cfg_.trust_udp_checksum) &&
             !wire::IcrcValid(h, p.from.address(), p.local_address(), p.from.port, sock.local().port, p.buf))) {
          ignored_results_++;
          continue;
        }
        if (h.held) {
          held_notice(h);
          continue;
        }
        SlotTrack* t = match(h);
        if (t == nullptr) {
          late_result(h);
          continue;
        }
        unicast_result(sock, rx_now);
        const size_t at = size_t(t->chunk) * chunk_elems * esize;
        if (own_of(t->chunk)) {  // the others' sum, combined with this rank's own contribution
          CombineInto(req.dtype, req.op, req.dst + at, req.src + at, p.buf + wire::kHeaderBytes,
                      h.length / esize);
        } else {
          (stream ? StreamCopy : PlainCopy)(req.dst + at, p.buf + wire::kHeaderBytes, h.length);
          if (!jumbo_ && !stream && t->chunk + kPrefetchAhead < nchunks) {
            const size_t ahead = size_t(t->chunk + kPrefetchAhead) * chunk_elems;
            PrefetchForWrite(req.dst + ahead * esize, std::min(chunk_elems, req.count - ahead) * esize);
          }
        }
        complete(*t, h.repeat_seen);
      }
      if (stream && got > 0) StreamFence();
      return Status::Ok();
    };
    Transport* socks[2] = {sock_.get(), group_.get()};
    const size_t nsocks = group_ ? 2 : 1;
    NR_RETURN_IF_ERROR(WaitReadable(socks, nsocks, wait_us));
    for (size_t i = 0; i < nsocks; ++i) NR_RETURN_IF_ERROR(drain(*socks[i]));
    // Timer sweep. A chunk with an early deadline is resent then, its timeout
    // unchanged. In a lane quiet for a whole timeout, the oldest expired chunk is
    // resent with its timeout doubled, once per that backed-off timeout.
    now = NowUs();
    const int64_t sweep_rto = Rto();
    if (now < next_due && sweep_rto >= last_sweep_rto) continue;
    last_sweep_rto = sweep_rto;
    next_due = now + 50000;
    std::vector<SlotTrack*>& probe = probes;
    std::fill(probe.begin(), probe.end(), nullptr);
    std::vector<SlotTrack*>& held_probe = held_probes;
    std::fill(held_probe.begin(), held_probe.end(), nullptr);
    auto resend = [&](SlotTrack& t) {
      // --fanout auto: the group bit as it stands now, not as when the chunk started
      const uint8_t bits = t.header[8];
      if (group_ && ((bits & wire::kExtGroupSeen) != 0) != group_watch_.Fresh(now)) {
        stamp(t, t.chunk, now, (bits & wire::kAckReqBit) != 0);
      }
      t.retries++;
      t.last_send_us = now;
      retransmits_++;
      queue_send(t);
    };
    for (uint32_t s = 0; s < window_; ++s) {
      SlotTrack& t = slots[s];
      if (t.chunk < 0) continue;
      // A chunk without an early deadline (or a held one's probe) is due once its lane
      // has been quiet for a timeout, and no sooner than the lane's next probe.
      const int64_t due = t.early || t.held
                              ? t.deadline_us
                              : std::max({t.deadline_us, lane_progress[t.lane] + sweep_rto,
                                          next_probe[t.lane]});
      next_due = std::min(next_due, due);
      if (t.deadline_us > now) continue;
      if (now - t.first_send_us >= timeout_us) {
        return Timeout("no result from the aggregator within " + std::to_string(cfg_.timeout_s) +
                       " s (" + std::to_string(retransmits_ - retransmits_at_start) +
                       " retransmissions) at " + Where(s) +
                       ", chunk " + std::to_string(t.chunk) + " of " + std::to_string(nchunks) +
                       "; is netreduce-switch running there and are all ranks alive?");
      }
      const size_t l = t.lane;
      if (t.held) {  // only its result can be missing now: the lane's oldest asks again
        if (held_probe[l] == nullptr || t.seq < held_probe[l]->seq) held_probe[l] = &t;
      } else if (t.early) {
        t.early = false;
        t.deadline_us = now + t.rto_us;
        due_by(t.deadline_us);
        fast_retransmits_++;
        if (t.probe) tail_probes_++, t.probe = false;
        resend(t);
      } else if (now - lane_progress[l] >= rto && (probe[l] == nullptr || t.seq < probe[l]->seq)) {
        probe[l] = &t;
      }
    }
    // Held chunks wait for the same ranks, so a lane asks for one of them per backed-off
    // interval, as a stalled lane probes (the window's others wait for that answer).
    for (size_t l = 0; l < held_probe.size(); ++l) {
      SlotTrack* p = held_probe[l];
      if (p == nullptr) continue;
      p->rto_us = std::min(p->rto_us * 2, kMaxHeldProbeUs);
      for (auto& o : slots) {
        if (o.chunk >= 0 && o.held && o.lane == l) o.deadline_us = now + p->rto_us;
      }
      held_probes_++;
      resend(*p);
    }
    for (size_t l = 0; l < probe.size(); ++l) {
      SlotTrack* p = probe[l];
      if (p == nullptr || now < next_probe[l]) continue;
      p->rto_us = std::min(p->rto_us * 2, kMaxRtoUs);
      p->deadline_us = now + p->rto_us;
      next_probe[l] = p->deadline_us;
      due_by(p->deadline_us);
      timeout_probes_++;
      resend(*p);
    }
  }
  rs.clean = true;  // every chunk answered: every slot idle again
  return Status::Ok();
}

}  // namespace netreduce
