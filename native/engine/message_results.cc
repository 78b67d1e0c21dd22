// A message's receive side (engine/message.h): waiting for results, draining a
// socket, matching each result to the chunk outstanding in its slot, and completing
// it (which starts the slot's next chunk); held notices and late results.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "engine/message.h"
#include "engine/prefetch.h"
#include "engine/rtt.h"

namespace netreduce {
using namespace engine_timing;
using namespace engine_prefetch;
using namespace engine_run;

Status Engine::Message::AwaitResults() {
  int64_t now = NowUs();
  Transport* socks[2] = {e_.sock_.get(), e_.group_.get()};
  Bump(e_.waits_);
  const int64_t due = e_.Rto() < last_sweep_rto_ ? now : next_due_;
  // The link binds and the engine has caught up: let a fraction of the window's
  // results queue before the next wake-up (engine/nap.h), up to the earliest evidence
  // deadline, and not while a lane is quiet (its timeout probe is near).
  const bool caught_up = !drained_full_[0] && (!e_.group_ || !drained_full_[1]);
  int64_t nap = nap_.NapUs(uint64_t(std::min<int64_t>(remaining_, e_.window_)), caught_up);
  if (nap > 0) {
    nap = std::min(nap, NapLimit(now, e_.Rto(), now + nap) - now);
    if (nap < engine_nap::kMinNapUs) nap = 0;
  }
  if (nap > 0) {
    nap_.Napping();
    std::this_thread::sleep_for(std::chrono::microseconds(nap));
    Bump(e_.naps_);
    Bump(e_.nap_us_, uint64_t(nap));
    now = NowUs();
  }
  const int64_t wait_us = std::min<int64_t>(50000, std::max<int64_t>(0, due - now));
  bool readable[2] = {true, true};
  NR_RETURN_IF_ERROR(WaitReadable(socks, e_.group_ ? 2 : 1, wait_us, readable));
  // A socket that polled empty is not drained (a receive call, and for a GRO socket
  // the set-up of its batch, per loop for nothing: with a group, the unicast socket
  // is empty nearly always) -- unless its last drain filled every descriptor: the
  // transport may hold the rest of a coalesced receive in its own memory.
  for (int i = 0; i < 2; ++i) may_hold_[i] = readable[i] || drained_full_[i];
  return Status::Ok();
}

// The chunk outstanding in the result's slot, if the result is for it.
SlotTrack* Engine::Message::Match(const wire::Header& h) {
  if (!h.result || (h.dest_qp != e_.my_qpn_ && h.dest_qp != e_.group_qpn_) || h.key != e_.cfg_.key ||
      h.slot >= e_.window_) {
    return nullptr;
  }
  SlotTrack& t = slots_[h.slot];
  if (t.chunk < 0 || h.msg_id != IdOf(t.chunk)) return nullptr;
  const size_t expect = NoticeOf(t.chunk) ? 0 : ElemsOf(t.chunk) * esize_;
  if (h.psn != (t.seq & wire::kPsnMask) || h.offset != FirstOf(t.chunk) || h.length != expect) {
    return nullptr;  // a duplicate or late result for a chunk already done
  }
  return &t;
}

// A held notice (wire::kExtHeld) for the chunk outstanding in its slot: the round has
// this rank's contribution and waits for others. Its round trip is the path's alone,
// the one sample a first message can give without the others' lag.
void Engine::Message::HeldNotice(const wire::Header& h) {
  if (h.dest_qp != e_.my_qpn_ || h.key != e_.cfg_.key || h.slot >= e_.window_ || h.length != 0) {
    Bump(e_.ignored_results_);
    return;
  }
  SlotTrack& t = slots_[h.slot];
  if (t.chunk < 0 || h.msg_id != IdOf(t.chunk) || h.psn != (t.seq & wire::kPsnMask) ||
      h.offset != FirstOf(t.chunk)) {
    return;  // for a chunk already done (its result came first)
  }
  Bump(e_.held_notices_);
  if (t.asked) {
    // The answer to a timeout probe (SweepTimers): the round holds this contribution
    // and waits for other ranks (their loss) or, in a rack, for the spine. Not lost,
    // so no early resend and no probe before its backed-off timeout; only its result
    // can be missing, and the rules for a result (overtaken, next expected, timeout)
    // stay. The lane's next probe goes now, to its next oldest expired chunk, at the
    // lane's back-off (SweepTimers): a rank's own lost share behind a round that
    // waits for another rank's repair was resent only once that round completed, one
    // chunk of a quiet lane per timeout (issue 33, lossprobe). The lane is still
    // quiet: its progress stays.
    Bump(e_.probe_notices_);
    t.early = t.probe = t.overtaken = false;
    t.deadline_us = rx_now_ + t.rto_us;
    DueBy(t.deadline_us);
    EvidenceBy(t.deadline_us);  // a bound only: an asked chunk is neither early nor held
    if (probe_walk_[t.lane] < kMaxProbeWalk) {
      probe_walk_[t.lane]++;
      next_probe_[t.lane] = 0;
      walk_now_[t.lane] = 1;
      DueBy(rx_now_);
    }
    return;
  }
  if (!t.held) {
    // Karn's rule, but for the job's very first sample: a notice that may answer a
    // resend (a tail probe that beat it on a loaded host) measured from the first send
    // can only overstate the round trip, and SampleRtt caps a first sample at the
    // initial timeout. Without it the next message asked for notices again, and a
    // rank's first messages kept being held and probed.
    if (t.head && (t.retries == 0 || e_.srtt_us_ == 0.0)) e_.SampleRtt(double(rx_now_ - t.first_send_us));
    t.rto_us = kHeldProbeUs;  // from now on the held probe's interval
  }
  t.held = true;
  t.early = t.probe = t.overtaken = false;
  t.deadline_us = rx_now_ + t.rto_us;
  EvidenceBy(t.deadline_us);
  lane_progress_[t.lane] = rx_now_;  // the path answers: no timeout probe yet
}

// A result that matches no outstanding chunk. A second result for a chunk that
// completed after a retransmission means the aggregator answered both sends: the first
// result answered the original, which was only slow (a rank stalled, a queue), not
// lost. Karn's rule hides exactly those long round trips from the estimator, so
// without this the timeout never learns them and keeps firing; feed the round trip of
// the original in (TCP's Eifel detection, in spirit). The record survives the
// message: the second result of a message's last chunks arrives while the next
// message runs.
void Engine::Message::LateResult(const wire::Header& h) {
  Bump(e_.ignored_results_);
  if (!h.result || (h.dest_qp != e_.my_qpn_ && h.dest_qp != e_.group_qpn_) || h.key != e_.cfg_.key ||
      h.slot >= e_.window_) {
    return;
  }
  Retried& r = e_.retried_[h.slot];
  if (r.sample_us >= 0 && h.msg_id == r.msg_id && h.psn == r.psn) {
    Bump(e_.spurious_retransmits_);
    // A copy marked repeat seen, after the group's result completed the chunk (the
    // group socket is drained first): proven needless as in Complete, and no sample
    // and no wider reorder window -- the wait was the slot's (another rank's loss),
    // not the path's.
    if (h.repeat_seen) {
      r.sample_us = -1;
      Bump(e_.needless_by_repeat_);
      return;
    }
    if (r.head) e_.SampleRtt(double(r.sample_us));
    r.sample_us = -1;
    // One step per round trip: a burst of late results is one piece of evidence.
    if (rx_now_ - e_.reorder_step_us_ >= int64_t(e_.srtt_us_)) {
      e_.reorder_steps_ = std::min(e_.reorder_steps_ + 1, kMaxReorderSteps);
      e_.reorder_step_us_ = rx_now_;
    }
    e_.late_seen_ = true;
  }
}

// Whether results from `sock` come in lane order. With a group that reaches this rank,
// the group's stream does; a unicast result is then out of band (a copy the rank's
// contribution asked for, one marked repeat seen, the answer to a resend), may come
// ahead of results still in the group's socket, and must not mark them as overtaken
// (that took them for lost: needless resends, which drew more out-of-band answers).
bool Engine::Message::InLaneOrder(const Transport& sock) const {
  return !e_.group_ || &sock == e_.group_.get() || !e_.group_watch_.Fresh(rx_now_);
}

// The result of `t` is in place: sample the round trip, give chunks it overtook their
// reorder deadline (only for a result of the lane's ordered stream), move the slot
// on. `repeat_seen`: the aggregator had this rank's contribution before a repeat of it
// arrived (kExtRepeatSeen).
void Engine::Message::Complete(SlotTrack& t, bool repeat_seen, bool in_lane_order) {
  Bump(e_.packets_received_);
  const int64_t t_now = rx_now_;
  const size_t lane = t.lane;
  // An inter-result gap: t was already on its way when the lane's previous result
  // came. Only the first result of a receive batch: those behind it in the same batch
  // waited in the socket, their spacing is the engine's, not the path's.
  if (first_of_batch_ && !t.held && lane_last_seq_[lane] >= 0 &&
      t.seq > uint64_t(lane_last_seq_[lane]) && t.last_send_us <= lane_progress_[lane]) {
    e_.SampleGap(double(t_now - lane_progress_[lane]));
  }
  first_of_batch_ = false;
  lane_progress_[lane] = t_now;
  // Progress ends a lane's probe back-off, as an ACK ends TCP's: the doubling is for a
  // lane that hears nothing. Kept after progress, a needless probe (its round waits for
  // another rank) held the lane's next probe back up to 1 s, and a tail of many rounds
  // each missing one rank's contribution was repaired at ~17 rounds a second.
  next_probe_[lane] = 0;
  probe_walk_[lane] = 0;
  walk_now_[lane] = 0;
  lane_backoff_[lane] = 0;
  lane_last_seq_[lane] = int64_t(t.seq);
  if (t.retries > 0) Bump(e_.repaired_chunks_), Bump(e_.repair_wait_us_, uint64_t(t_now - t.first_send_us));
  // A chunk whose resend the aggregator saw as a repeat was not lost: the slot was
  // waiting for another rank (its loss, or a descheduled process). Proven needless once
  // per chunk, like a second result above (so the record is not kept), so that only
  // this rank's own losses switch tail copies on. No round-trip sample: the wait was
  // the slot's, not the path's.
  const bool proven = t.retries > 0 && repeat_seen;
  if (proven) Bump(e_.spurious_retransmits_), Bump(e_.needless_by_repeat_);
  // The slot's record of an earlier chunk is left alone here: that chunk's second
  // result may still be on its way, behind this one (a group's result is drained before
  // a unicast answer to a resend), and msg_id + psn tell the two apart. Cleared on
  // this completion, the late answers of a stall matched nothing in about one
  // rank's stall in four, and that rank never learnt its resends were needless.
  if (t.retries == 0 || proven) {  // Karn: only unambiguous samples
    // (a held chunk's round trip is the wait for the others; its notice sampled)
    if (!proven && t.head && !t.held) e_.SampleRtt(double(t_now - t.first_send_us));
  } else {
    Retried& r = e_.retried_[t.slot];
    r.head = t.head && !t.held;  // a held chunk's first send waited for the others
    r.msg_id = IdOf(t.chunk);
    r.psn = uint32_t(t.seq & wire::kPsnMask);
    r.sample_us = t_now - t.first_send_us;
  }
  // Overtaken (RACK, RFC 8985, by transmission order): only chunks of t's lane whose
  // last transmission left before t's first. Not the microsecond of the send: every
  // chunk one receive batch starts shares it, and results handled out of sequence
  // order (a unicast result ahead of the group's backlog, loss) start their slots'
  // next chunks out of sequence order too, an order the aggregator's later rounds
  // then follow; an older chunk queued behind a newer one was taken for overtaken by
  // it, and a pause of the aggregator between their results made it a resend. And
  // not t's last transmission: t's result may answer its first (the group's result of
  // a round its resend found complete), and taking the resend's place marked every
  // chunk sent between the two -- a window's worth after a timeout probe. (Both made
  // the bursts of thousands of needless resends under multicast: BENCHMARKS.md, issue
  // 33.) A chunk resent since t's first transmission had its own chance. Next
  // expected: the lane's oldest chunk after t, once it has been out for the least
  // round trip seen.
  LaneOrder& order = rs_.lane_order[lane];
  const uint32_t mine = t.slot;
  size_t pos = 0;  // t's place in its lane: usually the front (results in order)
  while (order[pos] != mine) ++pos;
  const int64_t reorder_us =
      pos == 0 ? 0 : std::max<int64_t>(kReorderFloorUs, int64_t(e_.srtt_us_ / 4 * e_.reorder_steps_));
  for (size_t k = 0; in_lane_order && k < pos; ++k) {  // older chunks of the lane: overtaken
    SlotTrack& o = slots_[order[k]];
    if (o.early || o.last_tx > t.first_tx) continue;
    // A held chunk too: its round held this rank's contribution, and a later round of
    // the lane has completed, so its own result was most likely lost (or another
    // rank's contribution, which that rank repairs). It leaves the held state and is
    // repaired like any overtaken chunk -- the held probe asks for one chunk per lane a
    // second, and a burst of lost held results took minutes.
    if (o.held) o.held = false, o.rto_us = e_.Rto();
    o.early = o.overtaken = true;
    o.deadline_us = std::min(o.deadline_us, t_now + reorder_us);
    DueBy(o.deadline_us);
    EvidenceBy(o.deadline_us);
  }
  const size_t later = order.size() - pos - 1;  // outstanding chunks of the lane after t
  SlotTrack* expected = later > 0 ? &slots_[order[pos + 1]] : nullptr;
  order.erase(pos);
  // Only for the lane's last outstanding chunk: any other is covered when a later one
  // is answered, and a gap deadline on every chunk of a long window misfired whenever
  // the loaded host descheduled the aggregator for a few gaps.
  if (in_lane_order && expected != nullptr && later == 1 && !expected->early && !expected->held) {
    expected->early = true;
    expected->deadline_us = std::min(expected->deadline_us,
                                     std::max(t_now + e_.GapTimeout(), expected->last_send_us + e_.min_rtt_us_));
    DueBy(expected->deadline_us);
    EvidenceBy(expected->deadline_us);
  }
  --remaining_;
  const int64_t next = t.chunk + int64_t(e_.window_);
  if (next < nchunks_) {
    t.shadow ^= 1;  // window sequence numbers on: (seq / window) % 2 flips
    StartChunk(t, next, t_now);
  } else {
    t.chunk = -1;
  }
}

// The multicast group's bookkeeping (--fanout auto; group_watch.h).
void Engine::Message::GroupHeard(int64_t at, uint64_t n) {
  e_.group_watch_.Heard(at);
  Bump(e_.group_datagrams_, n);
}

// A result for `t` came by unicast. Evidence that the group stopped reaching this rank
// only if t's contribution said the group reached it (wire::kExtGroupSeen): the
// aggregator sends a copy to a rank whose contribution lacks the bit, so such a copy
// is expected -- and, drained before the group socket, it used to arrive "while the
// group was silent" and cleared the bit under load, which brought more copies. Nor
// for an owner-delivered chunk: its result (or notice) always comes by unicast, and
// taking it for evidence cleared the bit after every reduce-scatter longer than a
// timeout, so the next all-reduce's first window came twice (group and copy).
void Engine::Message::UnicastResult(const Transport& sock, const SlotTrack& t, int64_t at) {
  if (e_.group_ && &sock != e_.group_.get() && (t.header[8] & wire::kExtGroupSeen) != 0 &&
      OwnerOf(t.chunk) < 0) {
    e_.group_watch_.UnicastResult(at, e_.Rto());
  }
}

// Drain what one socket (unicast, or the job's multicast group) holds.
Status Engine::Message::Drain(Transport& sock) {
  const int which = &sock == e_.group_.get() ? 1 : 0;
  if (!may_hold_[which]) return Status::Ok();
  first_of_batch_ = true;
  // GRO: batches only. Otherwise jumbo datagrams are received in place (zero copy).
  size_t got = 0, max = 0;
  NR_RETURN_IF_ERROR(e_.jumbo_ && !sock.OwnsReceiveBuffers() ? DrainZeroCopy(sock, &got, &max)
                                                             : DrainBatch(sock, &got, &max));
  drained_full_[which] = got == max;
  nap_.Drained(rx_now_, got);
  return Status::Ok();
}

// With a group, the unicast socket is drained when a wait finds it readable; what came
// there after the last wait (answers to resends, which prove them needless: LateResult)
// is taken before the message ends, as when it was drained on every loop -- the
// proof is the round-trip estimate's, and one receive per message is cheap.
Status Engine::Message::DrainSkipped(Transport& sock) {
  if (may_hold_[0]) return Status::Ok();
  may_hold_[0] = true;
  return Drain(sock);
}

// Peek at each datagram's header, then receive its payload straight into its place in
// the destination buffer.
Status Engine::Message::DrainZeroCopy(Transport& sock, size_t* got, size_t* max) {
  uint8_t* const storage = rs_.storage.get();
  *max = kRecvBatch;
  for (size_t k = 0; k < kRecvBatch; ++k) {
    size_t len = 0;
    Endpoint from;
    NR_RETURN_IF_ERROR(sock.PeekHeader(peek_, wire::kHeaderBytes, 0, &len, &from));
    if (len == 0) break;
    ++*got;
    rx_now_ = NowUs();
    if (&sock == e_.group_.get()) GroupHeard(rx_now_, 1);
    wire::Header h;
    SlotTrack* t = nullptr;
    const bool ours = len <= kRecvBufBytes &&
                      wire::Decode(peek_, len, &h) == wire::DecodeError::kOk && h.jumbo;
    if (ours && h.held) {
      iovec iov = {storage, kRecvBufBytes};
      size_t got_len = 0;
      NR_RETURN_IF_ERROR(sock.RecvScatter(&iov, 1, &got_len));
      HeldNotice(h);
      continue;
    }
    if (ours) t = Match(h);
    size_t got_len = 0;
    if (t != nullptr) {
      // An owner's own shard lands in scratch first: its place holds the rank's own
      // contribution, which the others' sum is combined with.
      const size_t at = FirstOf(t->chunk) * esize_;
      const bool own = OwnOf(t->chunk);
      uint8_t* into = own ? storage : req_.dst + at;
      iovec iov[3] = {{peek_, wire::kHeaderBytes},
                      {into, h.length},
                      {trailer_, size_t(h.pad) + wire::kIcrcBytes}};
      NR_RETURN_IF_ERROR(sock.RecvScatter(iov, 3, &got_len));
      if (own) CombineInto(req_.dtype, req_.op, req_.dst + at, req_.src + at, into, h.length / esize_);
      if (req_.scale != 1.0) ScaleInto(req_.dtype, into, into, h.length / esize_, req_.scale);  // hot
      UnicastResult(sock, *t, rx_now_);
      Complete(*t, h.repeat_seen, InLaneOrder(sock));
    } else {
      iovec iov = {storage, kRecvBufBytes};
      NR_RETURN_IF_ERROR(sock.RecvScatter(&iov, 1, &got_len));
      if (ours) {
        LateResult(h);
      } else {
        Bump(e_.ignored_results_);
      }
    }
  }
  return Status::Ok();
}

// One receive batch: into the engine's buffers, or the transport's own (GRO), then
// each result copied into place.
Status Engine::Message::DrainBatch(Transport& sock, size_t* got_out, size_t* max) {
  const bool own_buffers = sock.OwnsReceiveBuffers();
  std::vector<InPacket>& in = rs_.in;
  if (!own_buffers) {
    for (size_t i = 0; i < kRecvBatch; ++i) {
      in[i].buf = rs_.storage.get() + i * kRecvBufBytes;
      in[i].cap = kRecvBufBytes;
    }
  }
  size_t got = 0;
  *max = own_buffers ? kRecvDescriptors : kRecvBatch;
  NR_RETURN_IF_ERROR(sock.RecvBatch(in.data(), *max, 0, &got));
  *got_out = got;
  // One clock read for the batch: its results were all in by now (a vDSO call per
  // result was about a tenth of the engine's CPU at MTU 1500).
  if (got > 0) rx_now_ = NowUs();
  if (got > 0 && &sock == e_.group_.get()) GroupHeard(rx_now_, got);
  const bool in_lane_order = InLaneOrder(sock);  // rx_now_ is the batch's
  for (size_t i = 0; i < got; ++i) {
    InPacket& p = in[i];
    wire::Header h;
    if (p.len > kRecvBufBytes || wire::Decode(p.buf, p.len, &h) != wire::DecodeError::kOk ||
        (!p.verified && wire::IcrcCheckNeeded(h, p.kernel_checked, e_.cfg_.trust_udp_checksum) &&
         !wire::IcrcValid(h, p.from.address(), p.local_address(), p.from.port, sock.local().port, p.buf))) {
      Bump(e_.ignored_results_);
      continue;
    }
    if (h.held) {
      HeldNotice(h);
      continue;
    }
    SlotTrack* t = Match(h);
    if (t == nullptr) {
      LateResult(h);
      continue;
    }
    UnicastResult(sock, *t, rx_now_);
    const size_t at = FirstOf(t->chunk) * esize_;
    if (OwnOf(t->chunk)) {  // the others' sum, combined with this rank's own contribution
      CombineInto(req_.dtype, req_.op, req_.dst + at, req_.src + at, p.buf + wire::kHeaderBytes,
                  h.length / esize_);
    } else {
      if (req_.scale != 1.0) {  // the copy and the Average's divide in one pass
        ScaleInto(req_.dtype, req_.dst + at, p.buf + wire::kHeaderBytes, h.length / esize_, req_.scale);
      } else {
        (stream_ ? StreamCopy : PlainCopy)(req_.dst + at, p.buf + wire::kHeaderBytes, h.length);
      }
      if (!e_.jumbo_ && !stream_ && t->chunk + kPrefetchAhead < nchunks_) {
        const int64_t ahead = t->chunk + kPrefetchAhead;
        PrefetchForWrite(req_.dst + FirstOf(ahead) * esize_, ElemsOf(ahead) * esize_);
      }
    }
    Complete(*t, h.repeat_seen, in_lane_order);
  }
  if (stream_ && got > 0) StreamFence();
  return Status::Ok();
}

}  // namespace netreduce
