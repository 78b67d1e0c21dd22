// A counter one data thread writes and any thread may read (the daemon's status and
// `counters` read them while the thread runs): a relaxed load and store, no locked
// instruction on the per-packet path, and no torn or racy read.
#pragma once

#include <atomic>
#include <cstdint>

namespace netreduce {
namespace xdp {

class Count {
 public:
  Count& operator+=(uint64_t d) {
    v_.store(v_.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
    return *this;
  }
  Count& operator++() { return *this += 1; }
  operator uint64_t() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

}  // namespace xdp
}  // namespace netreduce
