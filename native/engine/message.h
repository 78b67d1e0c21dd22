// One message through the window: Engine::Run (engine.cc) as named steps over the
// state a message needs beyond what the engine keeps between messages (run_state.h).
//
//   StartWindow    the first W chunks, one per slot
//   Flush          the queued packets, one SendBatch
//   AwaitResults   sleep until a socket is readable or the earliest deadline (first a
//                  nap, when the link binds: engine/nap.h)
//   Drain          what each socket holds: Match, then Complete, which starts the
//                  chunk W further on in the same slot (HeldNotice, LateResult for
//                  the others)
//   SweepTimers    resend what is due (engine/repair.h has the rules)
//
// The per-chunk path (chunks and results) is message_chunks.cc and
// message_results.cc, the timers message_timers.cc. Everything here runs on the
// engine's thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/nap.h"
#include "engine/run_state.h"
#include "wire/roce.h"

namespace netreduce {

// Submit's owner for a reduce-scatter laid out chunk-interleaved: chunk c's owner is
// rank c mod N, so every window carries every rank's data (docs/protocol.md).
constexpr int32_t kInterleavedOwners = -2;

class Engine::Message {
 public:
  // `req` has passed Engine::CheckRequest and has at least one element.
  Message(Engine& e, Request& req);

  bool Done() const { return remaining_ == 0; }
  void StartWindow();
  Status Flush();
  Status AwaitResults();
  Status Drain(Transport& sock);
  // The unicast socket once more if the last wait skipped it (message_results.cc).
  Status DrainSkipped(Transport& sock);
  Status SweepTimers();
  // Every chunk answered: every slot idle again (RunState::clean).
  void Finish();

 private:
  // Who a chunk's result goes to (owner delivery, reduce-scatter): the message's
  // owner, or rank c mod N when interleaved; -1 = everyone.
  int32_t OwnerOf(int64_t c) const {
    return interleaved_ ? (e_.cfg_.size > 1 ? int32_t(uint64_t(c) % e_.cfg_.size) : -1) : req_.owner;
  }
  uint32_t IdOf(int64_t c) const {
    const int32_t o = OwnerOf(c);
    return o >= 0 ? wire::MakeOwnerMsgId(counter_, uint32_t(o)) : (counter_ & ~wire::kOwnerFlag);
  }
  // Owner delivery: non-owners expect header-only notices (DMA length 0) ...
  bool NoticeOf(int64_t c) const {
    const int32_t o = OwnerOf(c);
    return o >= 0 && uint32_t(o) != e_.cfg_.rank;
  }
  // ... and the owner sends headers only for its own chunks (the slot counts them) and
  // combines its own data with the others' sum on arrival: (N-1)/N of the buffer out.
  bool OwnOf(int64_t c) const {
    const int32_t o = OwnerOf(c);
    return o >= 0 && uint32_t(o) == e_.cfg_.rank && e_.cfg_.size > 1;
  }
  size_t FirstOf(int64_t c) const { return size_t(c) * chunk_elems_; }
  size_t ElemsOf(int64_t c) const { return std::min(chunk_elems_, req_.count - FirstOf(c)); }
  void DueBy(int64_t at) { next_due_ = std::min(next_due_, at); }
  // An early (evidence) or held chunk's deadline was set to `at` (NapLimit).
  void EvidenceBy(int64_t at) { evidence_by_ = std::min(evidence_by_, at); }

  // message_chunks.cc: the send side.
  void QueueSend(engine_run::SlotTrack& t);
  wire::Header Stamp(engine_run::SlotTrack& t, int64_t c, int64_t now, bool ack_req);
  uint32_t IcrcSeedOf(uint32_t lane);
  void StartChunk(engine_run::SlotTrack& t, int64_t c, int64_t now);

  // message_results.cc: the receive side.
  // Each says how many datagrams it took (*got) of the most it asks for (*max).
  Status DrainZeroCopy(Transport& sock, size_t* got, size_t* max);
  Status DrainBatch(Transport& sock, size_t* got, size_t* max);
  engine_run::SlotTrack* Match(const wire::Header& h);
  void HeldNotice(const wire::Header& h);
  void LateResult(const wire::Header& h);
  void Complete(engine_run::SlotTrack& t, bool repeat_seen, bool in_lane_order);
  bool InLaneOrder(const Transport& sock) const;
  void GroupHeard(int64_t at, uint64_t n);
  void UnicastResult(const Transport& sock, const engine_run::SlotTrack& t, int64_t at);

  // message_timers.cc
  void Resend(engine_run::SlotTrack& t, int64_t now);
  int64_t NapLimit(int64_t now, int64_t rto, int64_t want);

  Engine& e_;
  Request& req_;
  RunState& rs_;
  std::vector<engine_run::SlotTrack>& slots_;
  const size_t esize_;
  const size_t chunk_elems_;
  const size_t full_bytes_;  // a full chunk's payload: chunk_elems_ elements
  const int64_t nchunks_;
  const uint32_t counter_;    // the message id's counter
  const bool interleaved_;    // owner = kInterleavedOwners
  const bool stream_;         // results into dst by streaming stores (prefetch.h)
  const uint64_t base_;       // sequence number of chunk 0
  const int64_t timeout_us_;  // a chunk with no result this long fails the message
  const uint64_t retransmits_at_start_;  // the timeout error counts this message's
  int64_t remaining_;
  // Per lane: last completion (progress), its chunk, no timeout probe before next_probe.
  std::vector<int64_t> lane_progress_, next_probe_, lane_last_seq_;
  // Per lane: held notices that answered its timeout probes since its last result (the
  // first kMaxProbeWalk of them send the lane's next probe at once: HeldNotice), the
  // back-off of its last timeout probe (0 after a result), and whether the next probe
  // is such a walk step (at that back-off, not doubled).
  std::vector<uint32_t> probe_walk_;
  std::vector<int64_t> lane_backoff_;
  std::vector<uint8_t> walk_now_;
  // A lower bound of the earliest deadline of any outstanding chunk (the sweep runs
  // when it may have come), and the RTO the last sweep used (a falling RTO moves lane
  // timeouts earlier than next_due_).
  int64_t next_due_ = 0;
  int64_t last_sweep_rto_ = 0;
  std::vector<engine_run::SlotTrack*> probes_, held_probes_;  // the sweep's, per lane
  uint64_t tx_ = 0;  // packets queued so far, in the order they leave (SlotTrack::last_tx)
  bool first_of_batch_ = true;  // the next result is the first of its receive batch
  // Per socket (0 the unicast one, 1 the group's): whether the last wait found it
  // readable or its last drain took as many datagrams as it asked for (AwaitResults).
  // Full at first: a message's first drain takes what a transport still holds.
  bool may_hold_[2] = {true, true};
  bool drained_full_[2] = {true, true};
  int64_t rx_now_ = 0;          // when the results being handled were received
  uint8_t peek_[wire::kHeaderBytes];
  uint8_t trailer_[8];
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
  // Last: the fields above keep their places (the per-result path reads them).
  engine_nap::NapClock nap_;  // the results' delivery rate, the nap it allows
  // After nap_, so that the fields above keep their places too. A lower bound of the
  // earliest deadline of an early or held chunk (every place that sets one lowers it;
  // NapLimit's walk makes it exact again), and when the sweep last walked every slot:
  // while no lane is quiet and no such deadline has come, a sweep has nothing to
  // resend and looks at the lanes only (SweepTimers).
  int64_t evidence_by_ = 0;
  int64_t last_walk_us_ = 0;
};

}  // namespace netreduce
