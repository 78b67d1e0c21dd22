// One job's slot pool: K slots x 2 shadow sets, each with an accumulator of P bytes,
// a worker bitmap, a count, and the round it belongs to.
//
// Slot state machine, per (slot, shadow) -- see docs/protocol.md:
//   EMPTY --first contribution of round r--> FILLING(r)
//   FILLING(r) --contribution N of r--> COMPLETE(r)   (result sent to all N ranks)
//   COMPLETE(r) --first contribution of round r' newer than r--> FILLING(r')
// A round is identified by the PSN of the chunk. A worker sends the next round of a
// slot only after it has that slot's previous result; so when round r' = r + 2K
// reaches (slot, shadow), every rank already holds round r's result and the state
// may be reused. That is why two shadow sets suffice and why the stored result of
// COMPLETE(r) can be resent to a late retransmission until then.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace netreduce {

struct SlotState {
  int32_t psn = -1;        // round tag; -1 = EMPTY
  uint32_t count = 0;      // contributions added
  bool complete = false;
  uint8_t dtype = 0;
  uint32_t length = 0;     // payload bytes (wire type)
  uint64_t offset = 0;     // element offset in the message
  uint32_t msg_id = 0;
  // Not beside dtype: the compiler would copy and compare the two as one 16-bit word,
  // a load that spans wire::Decode's two byte stores and stalls on store forwarding.
  uint8_t op = 0;
};

class SlotPool {
 public:
  SlotPool(uint32_t slots, uint32_t payload_bytes, uint32_t world_size);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  uint32_t slots() const { return slots_; }
  uint32_t payload_bytes() const { return payload_bytes_; }
  size_t memory_bytes() const { return accum_bytes_; }

  SlotState& state(uint32_t slot, uint32_t shadow) { return states_[slot * 2 + shadow]; }
  uint8_t* accumulator(uint32_t slot, uint32_t shadow) {
    return accum_ + (size_t(slot) * 2 + shadow) * payload_bytes_;
  }
  // Worker bitmap of (slot, shadow): returns true if `rank` was not yet set, and sets it.
  bool TestAndSet(uint32_t slot, uint32_t shadow, uint32_t rank) {
    uint64_t* w = &bitmap_[(size_t(slot) * 2 + shadow) * words_ + rank / 64];
    const uint64_t bit = uint64_t(1) << (rank % 64);
    if (*w & bit) return false;
    *w |= bit;
    return true;
  }
  void ResetRound(uint32_t slot, uint32_t shadow) {
    std::memset(&bitmap_[(size_t(slot) * 2 + shadow) * words_], 0, words_ * sizeof(uint64_t));
    std::memset(&repeats_[(size_t(slot) * 2 + shadow) * words_], 0, words_ * sizeof(uint64_t));
  }
  // Ranks whose contribution came again while the round was still waiting (a resend
  // or tail copy after the first had arrived): their results say so (kExtRepeatSeen).
  void MarkRepeat(uint32_t slot, uint32_t shadow, uint32_t rank) {
    repeats_[(size_t(slot) * 2 + shadow) * words_ + rank / 64] |= uint64_t(1) << (rank % 64);
  }
  bool Repeated(uint32_t slot, uint32_t shadow, uint32_t rank) const {
    return (repeats_[(size_t(slot) * 2 + shadow) * words_ + rank / 64] >> (rank % 64)) & 1;
  }

 private:
  uint32_t slots_;
  uint32_t payload_bytes_;
  size_t words_;
  std::vector<SlotState> states_;
  std::vector<uint64_t> bitmap_;
  std::vector<uint64_t> repeats_;  // same layout as bitmap_
  // The accumulators: a mapping of their own, so that a job's memory goes back to
  // the system the moment its pool is freed (a heap block could stay in a malloc
  // arena, and RSS would grow as jobs come and go: docs/operations.md).
  size_t accum_bytes_;
  uint8_t* accum_;
};

// PSN comparison modulo 2^24: is `a` newer than `b`?
inline bool PsnNewer(uint32_t a, uint32_t b) {
  const uint32_t diff = (a - b) & 0xFFFFFF;
  return diff != 0 && diff < 0x800000;
}

}  // namespace netreduce
