// The rack aggregator's uplink: the second level of a two-level (rack + spine) tree.
//
// A rack aggregator's job sums the contributions of its rack's members (a subset of
// the job's ranks, `Job::members`); when a slot has them all, the partial sum is not
// fanned out but sent, as one contribution, to the spine aggregator's job, in which
// this rack is one rank. The spine's result comes back to this aggregator, which
// stores it in the slot and fans it out to the members. docs/protocol.md, "Two
// levels", has the rules; in short:
//
// * the partial stays in the slot's accumulator until the spine's result replaces it,
//   so it can be resent, on this uplink's own rules (the engine's, one level up):
//   - overtaken: a spine result for a partial of the same spine lane sent later means
//     this one (or its result) was lost, or that the spine still waits on another
//     rack's share: resent a reorder window (srtt/4) after it was first seen
//     overtaken, the first time; later only once its (backed-off) timeout has also
//     passed since its last send;
//   - timeout relative to progress: when neither this partial's last send nor the
//     uplink's last spine result is younger than its timeout (RFC 6298-style estimate
//     of the spine's round trip, floor `rto_floor_us`), the partial is resent and its
//     timeout doubled (up to 1 s); one timeout resend per job per backed-off timeout,
//     so a spine that is only slow (waiting on another rack) costs a probe, not a
//     window of resends;
//   - a member's resend: a member that resends its share of a slot whose partial waits
//     on the spine is missing the result, so the partial is resent at once, at most
//     once per the spine's estimated round trip (EstimateUs: no floor, no backoff)
//     since its last send. Without it a spine result lost while many partials wait on
//     another rack's share came back only on the job's timeout turn, once per ~N x 1 s;
// * the spine recognises a resent partial as a duplicate of the rack's rank (its
//   bitmap), so nothing is added twice; a resent result is matched against the
//   pending slot and otherwise ignored;
// * worker retransmissions after completion are answered from the stored result, as
//   on a one-level aggregator.
//
// The spine's results may arrive on any data thread's socket (the spine answers the
// address it saw last), so the slots of a job with an uplink take a per-(slot, shadow)
// lock; one-level jobs take none.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"
#include "wire/roce.h"

namespace netreduce {

struct UplinkConfig {
  uint32_t spine_ip = 0;        // network order
  uint16_t spine_port = 0;      // the spine's first data port, host order
  uint32_t spine_threads = 1;   // its data ports: spine_port + slot % spine_threads
  uint32_t job_index = 0;       // the spine job's index (QPN prefix)
  uint32_t rank = 0;            // this rack's rank in the spine job
  uint32_t key = 0;             // the spine job's key
  uint32_t local_ip = 0;        // this aggregator's address toward the spine (network order)
  uint32_t rto_floor_us = 1000;
  double drop_rate = 0.0;       // testing: drop this share of partials sent and results received
  uint32_t drop_results = 0;    // testing: drop the job's first this many spine results received
};

class Uplink {
 public:
  Uplink(const UplinkConfig& cfg, uint32_t slots);

  const UplinkConfig& config() const { return cfg_; }

  struct Entry {
    std::mutex mu;
    bool pending = false;      // partial sent, spine result not yet here
    uint32_t sends = 0;        // of this round's partial (Karn: sample only when 1)
    uint64_t sent_ns = 0;      // last send
    uint64_t first_ns = 0;
    uint64_t marked_ns = 0;    // first seen overtaken since its last send; 0 = not
    uint32_t rto_us = 0;       // this entry's timeout (backed off per resend)
    wire::Header round;        // the completing contribution's header (the RA job's)
  };
  Entry& entry(uint32_t slot, uint32_t shadow) { return entries_[size_t(slot) * 2 + shadow]; }
  std::unique_lock<std::mutex> Lock(uint32_t slot, uint32_t shadow) {
    return std::unique_lock<std::mutex>(entry(slot, shadow).mu);
  }
  uint32_t slots() const { return slots_; }

  // The retransmission timeout now, microseconds.
  uint32_t Rto() const;
  // The cap of a backed-off timeout: 1 s, or the configured floor where that is larger
  // (a floor above 1 s is honoured after the first sample and through the backoff).
  uint32_t MaxRtoUs() const;
  // The spine's round trip as estimated (srtt + 4 rttvar; the initial timeout before a
  // sample), microseconds: no floor, no backoff. The pace of resends a member asks for.
  uint32_t EstimateUs() const;
  uint32_t ReorderWindowUs() const;
  void Sample(uint64_t rtt_ns);
  // The testing drop knobs: true when this packet is to be dropped. DropResult: a spine
  // result, by drop_results (the first ones) or else by drop_rate.
  bool Drop();
  bool DropResult();

  // Progress: the last spine result, and per spine lane (slot % spine threads) the
  // latest send among the partials answered (the overtaken rule).
  std::atomic<uint64_t> last_result_ns{0};
  std::atomic<uint64_t> hold_until_ns{0};  // no timeout resend before this
  std::atomic<uint64_t>& answered_sent_ns(uint32_t slot) {
    return answered_[slot % answered_.size()];
  }

  // Counters, merged into the job's (JobCounters).
  std::atomic<uint64_t> partials_sent{0};     // first sends of a partial
  std::atomic<uint64_t> partials_resent{0};   // on timeout or a member's retransmission
  std::atomic<uint64_t> results_received{0};  // spine results matched to a pending slot
  std::atomic<uint64_t> results_ignored{0};   // duplicates, late or foreign results
  std::atomic<uint64_t> dropped{0};           // by the testing drop knobs
  std::atomic<uint64_t> repeat_resends{0};    // of those resent, on a member's resend
  void AddTo(std::map<std::string, uint64_t>* out) const;

 private:
  UplinkConfig cfg_;
  uint32_t slots_;
  std::vector<Entry> entries_;
  std::vector<std::atomic<uint64_t>> answered_;
  mutable std::mutex est_mu_;  // the round-trip estimate: one update per slot result
  double srtt_us_ = 0, rttvar_us_ = 0;
  bool sampled_ = false;
  std::atomic<uint32_t> results_seen_{0};  // by DropResult, for drop_results
};

// The spine results' routes: (spine ip, spine job index) -> this aggregator's job.
class UplinkRoutes {
 public:
  void Set(uint32_t spine_ip, uint32_t spine_job, uint32_t index);
  void Remove(uint32_t index);
  // 0 = none.
  uint32_t Find(uint32_t spine_ip, uint32_t spine_job) const;
  bool any() const { return count_.load(std::memory_order_relaxed) != 0; }

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, uint32_t> routes_;
  std::atomic<uint32_t> count_{0};
};

uint64_t MonotonicNs();

}  // namespace netreduce
