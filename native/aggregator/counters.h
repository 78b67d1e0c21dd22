// Aggregator counters, kept per job and globally, and per data thread in each: a
// thread adds only to its own shard, so the hot path shares no counter cache line
// between threads (a shared atomic add per packet and counter made every thread's
// packets bounce those lines between cores). Relaxed atomics: they are statistics,
// read over the control port by summing the shards, never used for synchronisation.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace netreduce {

enum class Drop : int {
  kTruncated = 0,   // shorter than the RoCE headers + ICRC
  kBadOpcode,       // not UC RDMA WRITE Only with Immediate
  kBadLength,       // DMA length, pad and datagram size disagree, or exceed the slot
  kUnknownJob,      // destination QP names no admitted job
  kBadKey,          // R_Key is not the job's key
  kBadRank,         // rank >= the job's world size
  kBadDtype,        // dtype code unknown
  kBadOp,           // op code unknown
  kBadSlot,         // slot >= the job's pool, or sent to the wrong data port
  kBadIcrc,         // RoCE-sized packet whose ICRC does not verify
  kInconsistent,    // a contribution disagrees with the slot's round (offset/length/dtype/op/message)
  kStale,           // an old round's packet for a slot that has moved on
  kResultFlag,      // a packet marked as a result sent to the aggregator
  kBadSource,       // from an address other than the data address its rank registered
  kCount
};
const char* DropName(Drop d);

struct alignas(64) Counters {
  std::atomic<uint64_t> packets_in{0};
  std::atomic<uint64_t> packets_out{0};
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint64_t> bytes_reduced{0};     // payload bytes added into slots
  std::atomic<uint64_t> rounds_started{0};    // (slot, shadow) rounds begun; minus completed = filling
  std::atomic<uint64_t> slots_completed{0};
  std::atomic<uint64_t> duplicates{0};        // contributions seen before (not added again)
  std::atomic<uint64_t> retransmitted_results{0};
  std::atomic<uint64_t> held_notices{0};      // header-only "held" answers (kExtHeld)
  std::atomic<uint64_t> group_unicast_copies{0};  // --fanout auto: results also sent unicast
  std::atomic<uint64_t> drops[int(Drop::kCount)] = {};

  // One writer per shard (its data thread): a load and a store, no locked add.
  void Add(std::atomic<uint64_t>& c, uint64_t v = 1) {
    c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
  void AddDrop(Drop d) { Add(drops[int(d)]); }
  std::map<std::string, uint64_t> Snapshot() const;
};

// One Counters per data thread (thread t writes shard t only).
class CounterShards {
 public:
  explicit CounterShards(uint32_t threads) : shards_(threads ? threads : 1) {}
  Counters& at(uint32_t thread) { return shards_[thread < shards_.size() ? thread : 0]; }
  void Add(uint32_t thread, std::atomic<uint64_t> Counters::*field, uint64_t v = 1) {
    Counters& c = at(thread);
    c.Add(c.*field, v);
  }
  // The sums over all shards, as Counters::Snapshot names them.
  std::map<std::string, uint64_t> Snapshot() const;
  // One counter summed, e.g. Sum(&Counters::packets_in).
  uint64_t Sum(std::atomic<uint64_t> Counters::*field) const {
    uint64_t v = 0;
    for (const Counters& c : shards_) v += (c.*field).load(std::memory_order_relaxed);
    return v;
  }

 private:
  std::vector<Counters> shards_;
};

// Job admission, aggregator-wide: jobs admitted, and refused by reason.
enum class Refusal : int {
  kInvalid = 0,  // world size out of range, multicast group unresolvable
  kMaxJobs,      // --max-jobs jobs already admitted
  kMemory,       // the job's slot pool does not fit in --memory-mb
  kCount
};
const char* RefusalName(Refusal r);

struct AdmissionCounters {
  std::atomic<uint64_t> admitted{0};
  std::atomic<uint64_t> refused[int(Refusal::kCount)] = {};

  void Refuse(Refusal r) { refused[int(r)].fetch_add(1, std::memory_order_relaxed); }
  // jobs_admitted, jobs_refused_<reason>, jobs_refused (total).
  void AddTo(std::map<std::string, uint64_t>* m) const;
};

}  // namespace netreduce
