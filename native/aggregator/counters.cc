#include "aggregator/counters.h"

namespace netreduce {

const char* DropName(Drop d) {
  static const char* kNames[] = {"truncated", "bad_opcode", "bad_length", "unknown_job",
                                 "bad_key",   "bad_rank",   "bad_dtype",  "bad_op",
                                 "bad_slot",  "bad_icrc",   "inconsistent", "stale",
                                 "result_flag", "bad_source"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == int(Drop::kCount), "drop names");
  return kNames[int(d)];
}

std::map<std::string, uint64_t> Counters::Snapshot() const {
  auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  std::map<std::string, uint64_t> m{
      {"packets_in", get(packets_in)},
      {"packets_out", get(packets_out)},
      {"bytes_in", get(bytes_in)},
      {"bytes_out", get(bytes_out)},
      {"bytes_reduced", get(bytes_reduced)},
      // completed before started: read in this order, started - completed >= 0.
      {"slots_completed", get(slots_completed)},
      {"rounds_started", get(rounds_started)},
      {"duplicates", get(duplicates)},
      {"retransmitted_results", get(retransmitted_results)},
      {"group_unicast_copies", get(group_unicast_copies)},
      {"held_notices", get(held_notices)},
  };
  uint64_t total = 0;
  for (int i = 0; i < int(Drop::kCount); ++i) {
    const uint64_t v = get(drops[i]);
    m[std::string("drop_") + DropName(Drop(i))] = v;
    total += v;
  }
  m["drops"] = total;
  return m;
}

std::map<std::string, uint64_t> CounterShards::Snapshot() const {
  std::map<std::string, uint64_t> sum;
  for (const Counters& c : shards_) {
    for (const auto& kv : c.Snapshot()) sum[kv.first] += kv.second;
  }
  return sum;
}

const char* RefusalName(Refusal r) {
  static const char* kNames[] = {"invalid", "max_jobs", "memory"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == int(Refusal::kCount), "refusal names");
  return kNames[int(r)];
}

void AdmissionCounters::AddTo(std::map<std::string, uint64_t>* m) const {
  (*m)["jobs_admitted"] = admitted.load(std::memory_order_relaxed);
  uint64_t total = 0;
  for (int i = 0; i < int(Refusal::kCount); ++i) {
    const uint64_t v = refused[i].load(std::memory_order_relaxed);
    (*m)[std::string("jobs_refused_") + RefusalName(Refusal(i))] = v;
    total += v;
  }
  (*m)["jobs_refused"] = total;
}

}  // namespace netreduce
