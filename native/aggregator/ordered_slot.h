// Deterministic reduction (NETREDUCE_DETERMINISTIC=1): a slot folds its contributions
// in rank order, whatever order the packets arrive in.
//
// Float addition is not associative, so a slot that adds contributions as they come
// gives results that depend on which rank's packet arrived first, and a training run
// is not bit-reproducible. Here a slot's result is always the left fold
//     ((c[r0] op c[r1]) op c[r2]) op ...   with r0 < r1 < r2 < ... the contributing ranks
// computed in the accumulator's type (float32 for 16-bit floats, as without ordering).
//
// How: the accumulator holds the fold of a prefix of the ranks. A contribution from
// the rank right after that prefix is folded in at once (and then any kept ones that
// now follow on); a contribution from a later rank is kept in a staging buffer of its
// own until the ranks before it are in. When the slot's last contribution arrives,
// whatever is still kept is folded in rank order (ranks that never contribute to a
// slot, e.g. non-members in a two-level tree, leave gaps that only move the folding
// to completion). In-order arrival costs nothing extra; out-of-order arrival costs
// one copy of the late-folded payloads. Memory: (N-1) staging buffers of P bytes per
// slot and shadow, K x 2 x (N-1) x P per job (rank 0 always extends the empty prefix,
// so it never needs one), counted against --memory-mb.
//
// Not thread-safe by itself: each (slot, shadow) has one writer, the data thread that
// owns the slot (aggregator.h), as for the slot pool.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "reduce/dtype.h"

namespace netreduce {

class OrderedSlots {
 public:
  OrderedSlots(uint32_t slots, uint32_t payload_bytes, uint32_t world_size);
  ~OrderedSlots();
  OrderedSlots(const OrderedSlots&) = delete;
  OrderedSlots& operator=(const OrderedSlots&) = delete;

  // Bytes of staging memory the job holds (what --memory-mb is charged).
  static uint64_t MemoryBytes(uint32_t slots, uint32_t payload_bytes, uint32_t world_size);
  size_t memory_bytes() const { return stage_bytes_; }

  // `rank`'s first contribution to the round on (slot, shadow): `n` elements in wire
  // type at `payload`, `acc` the slot's accumulator. `round_start`: the first
  // contribution of a new round (forgets what the previous round kept). `empty`: the
  // rank counts but adds nothing (a reduce-scatter owner's header-only contribution
  // to its own shard, which it combines itself).
  void Add(uint32_t slot, uint32_t shadow, uint32_t rank, DType dt, Op op, uint8_t* acc,
           const uint8_t* payload, size_t n, bool round_start, bool empty = false);
  // The round's last contribution is in: folds what is still kept, in rank order, so
  // that `acc` holds the rank-order fold of every contribution.
  void Complete(uint32_t slot, uint32_t shadow, DType dt, Op op, uint8_t* acc, size_t n);

  // Contributions that had to wait for a lower rank's (a measure of reordering).
  uint64_t staged() const { return staged_.load(std::memory_order_relaxed); }

 private:
  size_t Index(uint32_t slot, uint32_t shadow) const { return size_t(slot) * 2 + shadow; }
  uint8_t* Stage(size_t i, uint32_t rank) {
    return stage_ + (i * (size_ - 1) + (rank - 1)) * size_t(payload_bytes_);
  }
  void Fold(size_t i, DType dt, Op op, uint8_t* acc, const uint8_t* in, size_t n);

  uint32_t slots_;
  uint32_t payload_bytes_;
  uint32_t size_;
  std::vector<uint32_t> next_;    // per (slot, shadow): lowest rank not folded yet
  std::vector<uint8_t> folded_;   // per (slot, shadow): anything folded into acc yet
  // per (slot, shadow, rank): 0 nothing kept, kStaged payload waiting, kEmpty counted
  // contribution with nothing to fold
  std::vector<uint8_t> kept_;
  static constexpr uint8_t kStaged = 1, kEmpty = 2;
  size_t stage_bytes_;
  uint8_t* stage_;  // its own mapping, returned to the system when the job goes
  std::atomic<uint64_t> staged_{0};
};

}  // namespace netreduce
