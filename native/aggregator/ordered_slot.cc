#include "aggregator/ordered_slot.h"

#include <sys/mman.h>

#include <cstring>
#include <new>

namespace netreduce {

uint64_t OrderedSlots::MemoryBytes(uint32_t slots, uint32_t payload_bytes, uint32_t world_size) {
  return uint64_t(slots) * 2 * (world_size > 0 ? world_size - 1 : 0) * payload_bytes;
}

OrderedSlots::OrderedSlots(uint32_t slots, uint32_t payload_bytes, uint32_t world_size)
    : slots_(slots),
      payload_bytes_(payload_bytes),
      size_(world_size),
      next_(size_t(slots) * 2, 0),
      folded_(size_t(slots) * 2, 0),
      kept_(size_t(slots) * 2 * world_size, 0),
      stage_bytes_(MemoryBytes(slots, payload_bytes, world_size)),
      stage_(nullptr) {
  // Anonymous pages: untouched staging (in-order arrival) never becomes resident.
  void* p = mmap(nullptr, stage_bytes_ ? stage_bytes_ : 1, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  stage_ = static_cast<uint8_t*>(p);
}

OrderedSlots::~OrderedSlots() { munmap(stage_, stage_bytes_ ? stage_bytes_ : 1); }

void OrderedSlots::Fold(size_t i, DType dt, Op op, uint8_t* acc, const uint8_t* in, size_t n) {
  Accumulate(dt, op, acc, in, n, folded_[i] == 0);
  folded_[i] = 1;
}

void OrderedSlots::Add(uint32_t slot, uint32_t shadow, uint32_t rank, DType dt, Op op,
                       uint8_t* acc, const uint8_t* payload, size_t n, bool round_start,
                       bool empty) {
  const size_t i = Index(slot, shadow);
  uint8_t* kept = &kept_[i * size_];
  if (round_start) {
    next_[i] = 0;
    folded_[i] = 0;
    std::memset(kept, 0, size_);
  }
  if (rank != next_[i]) {  // a lower rank's contribution is still missing: keep this one
    if (empty) {
      kept[rank] = kEmpty;
      return;
    }
    std::memcpy(Stage(i, rank), payload, n * ElementSize(dt));
    kept[rank] = kStaged;
    staged_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (!empty) Fold(i, dt, op, acc, payload, n);
  uint32_t r = rank + 1;
  for (; r < size_ && kept[r]; ++r) {  // the kept ones that now follow on
    if (kept[r] == kStaged) Fold(i, dt, op, acc, Stage(i, r), n);
    kept[r] = 0;
  }
  next_[i] = r;
}

void OrderedSlots::Complete(uint32_t slot, uint32_t shadow, DType dt, Op op, uint8_t* acc,
                            size_t n) {
  const size_t i = Index(slot, shadow);
  uint8_t* kept = &kept_[i * size_];
  for (uint32_t r = next_[i]; r < size_; ++r) {  // behind a rank that never contributes
    if (kept[r] != kStaged) continue;
    Fold(i, dt, op, acc, Stage(i, r), n);
    kept[r] = 0;
  }
  next_[i] = size_;
}

}  // namespace netreduce
