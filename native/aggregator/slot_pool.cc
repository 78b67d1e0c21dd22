#include "aggregator/slot_pool.h"

#include <sys/mman.h>

#include <new>

namespace netreduce {

SlotPool::SlotPool(uint32_t slots, uint32_t payload_bytes, uint32_t world_size)
    : slots_(slots),
      payload_bytes_(payload_bytes),
      words_(world_size > 64 ? (size_t(world_size) + 63) / 64 : 1),
      states_(size_t(slots) * 2),
      bitmap_(size_t(slots) * 2 * (words_ - 1), 0),
      repeats_(size_t(slots) * 2 * (words_ - 1), 0),
      accum_bytes_(size_t(slots) * 2 * payload_bytes),
      stride_(kHeadroom + payload_bytes + kTailroom),
      map_bytes_(size_t(slots) * 2 * stride_),
      accum_(nullptr) {
  // Anonymous pages read as zeros; RSS grows only as slots are used.
  void* p = mmap(nullptr, map_bytes_ ? map_bytes_ : 1, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  accum_ = static_cast<uint8_t*>(p);
}

SlotPool::~SlotPool() { munmap(accum_, map_bytes_ ? map_bytes_ : 1); }

}  // namespace netreduce
