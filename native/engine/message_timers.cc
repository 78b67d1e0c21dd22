// A message's timers (engine/message.h; the rules in engine/repair.h): the sweep
// over every outstanding chunk that resends what is due.
//
// The sweep runs when the earliest deadline may have come (next_due_, a lower bound
// kept as deadlines are set), or when the RTO estimate fell below the one the last
// sweep used: lane timeouts are lane_progress + RTO, so only a falling RTO moves a due
// time earlier than next_due_. No periodic wake-up: a job of 1,000 ranks waiting on
// its slowest rank has 1,000 engines in a message, and a wake-up every 2 ms each was
// 500,000 a second.
#include <algorithm>
#include <limits>
#include <string>

#include "engine/message.h"
#include "engine/rtt.h"

namespace netreduce {
using namespace engine_timing;
using namespace engine_run;

// The longest a sweep goes without walking every slot (the whole-message timeout is
// checked there): the most a wait lasts, too.
constexpr int64_t kWalkUs = 50000;

void Engine::Message::Resend(SlotTrack& t, int64_t now) {
  // --fanout auto: the group bit as it stands now, not as when the chunk started
  const uint8_t bits = t.header[8];
  if (e_.group_ && ((bits & wire::kExtGroupSeen) != 0) != e_.group_watch_.Fresh(now)) {
    Stamp(t, t.chunk, now, (bits & wire::kAckReqBit) != 0);
  }
  t.retries++;
  t.last_send_us = now;
  e_.retransmits_++;
  QueueSend(t);
}

// Until when the engine may nap (engine/nap.h), if before `want`: the earliest deadline
// set by evidence (overtaken, next expected, tail probe) or a held chunk's probe; now
// when a lane with chunks outstanding has been quiet for a timeout. A lane's timeout
// itself is no limit otherwise: it counts from the lane's last result, and the drain
// after the nap takes the results that came during it before the sweep runs. The
// slots are walked only when evidence_by_ (a lower bound) falls before `want`: a walk
// over a 2 MiB window at MTU 1500 is 1,464 slots, ~100 times per 64 MiB all-reduce.
int64_t Engine::Message::NapLimit(int64_t now, int64_t rto, int64_t want) {
  for (size_t l = 0; l < lane_progress_.size(); ++l) {
    if (rs_.lane_order[l].size() > 0 && now - lane_progress_[l] >= rto) return now;
  }
  if (evidence_by_ >= want) return want;
  int64_t limit = std::numeric_limits<int64_t>::max();
  for (uint32_t s = 0; s < e_.window_; ++s) {
    const SlotTrack& t = slots_[s];
    if (t.chunk >= 0 && (t.early || t.held)) limit = std::min(limit, t.deadline_us);
  }
  evidence_by_ = limit;
  return limit;
}

// A chunk with an early deadline is resent then, its timeout unchanged. In a lane
// quiet for a whole timeout, the oldest expired chunk is resent with its timeout
// doubled, once per that backed-off timeout -- or until a held notice answers it (its
// round waits for others): then the lane's next oldest expired chunk goes at once, at
// the same back-off (the lane's, not the chunk's own: a lane quiet for long doubles
// its interval, whichever chunk it asks), up to kMaxProbeWalk per quiet spell. Held
// chunks: one probe per lane per backed-off interval.
Status Engine::Message::SweepTimers() {
  const int64_t now = NowUs();
  const int64_t rto = e_.Rto();
  if (now < next_due_ && rto >= last_sweep_rto_) return Status::Ok();
  last_sweep_rto_ = rto;
  next_due_ = now + 50000;
  // Nothing is due while no evidence or held deadline has come and no lane with chunks
  // outstanding is quiet (a chunk without evidence is due no sooner than its lane's
  // timeout and next probe): the lanes give next_due_'s bound without the walk. The
  // whole-message timeout is checked by a full walk at least every kWalkUs.
  if (now < evidence_by_ && now - last_walk_us_ < kWalkUs) {
    bool quiet = false;
    for (size_t l = 0; l < lane_progress_.size() && !quiet; ++l) {
      if (rs_.lane_order[l].size() == 0) continue;
      quiet = now - lane_progress_[l] >= rto;
      next_due_ = std::min(next_due_, std::max(lane_progress_[l] + rto, next_probe_[l]));
    }
    if (!quiet) {
      next_due_ = std::min(next_due_, evidence_by_);
      return Status::Ok();
    }
    next_due_ = now + 50000;
  }
  last_walk_us_ = now;
  int64_t evidence = std::numeric_limits<int64_t>::max();
  std::fill(probes_.begin(), probes_.end(), nullptr);
  std::fill(held_probes_.begin(), held_probes_.end(), nullptr);
  for (uint32_t s = 0; s < e_.window_; ++s) {
    SlotTrack& t = slots_[s];
    if (t.chunk < 0) continue;
    // A chunk without an early deadline (or a held one's probe) is due once its lane
    // has been quiet for a timeout, and no sooner than the lane's next probe.
    const int64_t due = t.early || t.held
                            ? t.deadline_us
                            : std::max({t.deadline_us, lane_progress_[t.lane] + rto, next_probe_[t.lane]});
    next_due_ = std::min(next_due_, due);
    if (t.deadline_us > now) {
      if (t.early || t.held) evidence = std::min(evidence, t.deadline_us);
      continue;
    }
    if (now - t.first_send_us >= timeout_us_) {
      return Timeout("no result from the aggregator within " + std::to_string(e_.cfg_.timeout_s) +
                     " s (" + std::to_string(e_.retransmits_ - retransmits_at_start_) +
                     " retransmissions) at " + e_.Where(s) + ", chunk " + std::to_string(t.chunk) +
                     " of " + std::to_string(nchunks_) +
                     "; is netreduce-switch running there and are all ranks alive?");
    }
    const size_t l = t.lane;
    if (t.held) {  // only its result can be missing now: the lane's oldest asks again
      if (held_probes_[l] == nullptr || t.seq < held_probes_[l]->seq) held_probes_[l] = &t;
    } else if (t.early) {
      t.early = false;
      t.deadline_us = now + t.rto_us;
      DueBy(t.deadline_us);
      e_.fast_retransmits_++;
      if (t.probe) {
        e_.tail_probes_++;
      } else if (t.overtaken) {
        e_.overtaken_resends_++;
      } else {
        e_.gap_resends_++;
      }
      t.probe = t.overtaken = false;
      Resend(t, now);
    } else if (now - lane_progress_[l] >= rto && (probes_[l] == nullptr || t.seq < probes_[l]->seq)) {
      probes_[l] = &t;
    }
  }
  // Exact again: the early chunks due now were resent as plain ones, and the held
  // ones due now get new deadlines just below.
  evidence_by_ = evidence;
  // Held chunks wait for the same ranks, so a lane asks for one of them per backed-off
  // interval, as a stalled lane probes (the window's others wait for that answer).
  for (size_t l = 0; l < held_probes_.size(); ++l) {
    SlotTrack* p = held_probes_[l];
    if (p == nullptr) continue;
    p->rto_us = std::min(p->rto_us * 2, kMaxHeldProbeUs);
    for (auto& o : slots_) {
      if (o.chunk >= 0 && o.held && o.lane == l) o.deadline_us = now + p->rto_us;
    }
    EvidenceBy(now + p->rto_us);
    e_.held_probes_++;
    Resend(*p, now);
  }
  for (size_t l = 0; l < probes_.size(); ++l) {
    SlotTrack* p = probes_[l];
    if (p == nullptr || now < next_probe_[l]) continue;
    const int64_t at = std::max(p->rto_us, lane_backoff_[l]);
    p->rto_us = std::min(walk_now_[l] ? at : at * 2, kMaxRtoUs);
    lane_backoff_[l] = p->rto_us;
    walk_now_[l] = 0;
    p->deadline_us = now + p->rto_us;
    next_probe_[l] = p->deadline_us;
    DueBy(p->deadline_us);
    e_.timeout_probes_++;
    // UDP: the probe asks whether the round holds this contribution (AckReq). A held
    // notice (HeldNotice) then frees the lane's next probe at once for its next
    // oldest chunk, instead of the lane waiting until this round completes.
    if (!e_.cfg_.transport && (p->header[8] & wire::kAckReqBit) == 0) {
      Stamp(*p, p->chunk, now, true);
      p->asked = true;
    }
    Resend(*p, now);
  }
  return Status::Ok();
}

}  // namespace netreduce
