#include "aggregator/slot_pool.h"

namespace netreduce {

SlotPool::SlotPool(uint32_t slots, uint32_t payload_bytes, uint32_t world_size)
    : slots_(slots),
      payload_bytes_(payload_bytes),
      words_((world_size + 63) / 64),
      states_(size_t(slots) * 2),
      bitmap_(size_t(slots) * 2 * words_, 0),
      accum_(size_t(slots) * 2 * payload_bytes, 0) {}

}  // namespace netreduce
