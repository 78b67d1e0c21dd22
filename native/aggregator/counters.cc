#include "aggregator/counters.h"

namespace netreduce {

const char* DropName(Drop d) {
  static const char* kNames[] = {"truncated", "bad_opcode", "bad_length", "unknown_job",
                                 "bad_key",   "bad_rank",   "bad_dtype",  "bad_op",
                                 "bad_slot",  "bad_icrc",   "inconsistent", "stale",
                                 "result_flag"};
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
      {"slots_completed", get(slots_completed)},
      {"duplicates", get(duplicates)},
      {"retransmitted_results", get(retransmitted_results)},
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

}  // namespace netreduce
