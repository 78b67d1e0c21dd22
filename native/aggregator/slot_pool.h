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

// One cache line per (slot, shadow): the round's state and, for ranks 0..63, its worker
// and repeat bits. They were three arrays (states, bitmap words, repeat words), cleared
// by two memset calls per round, and the bitmap word's load held about half of
// HandleDatagram's samples at MTU 1500 (perf, 12-05): one line to miss now, no call.
struct alignas(64) SlotState {
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
  uint64_t seen = 0;     // ranks 0..63 whose contribution this round holds
  uint64_t repeats = 0;  // ranks 0..63 whose contribution came again (MarkRepeat)
};

class SlotPool {
 public:
  SlotPool(uint32_t slots, uint32_t payload_bytes, uint32_t world_size);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // Room around each accumulator for one result datagram built in place: its RoCE
  // headers before (wire::kHeaderBytes) and its pad and ICRC after (at most 3 + 4 bytes
  // past the payload, inside P for a short chunk), 8 in all to keep the next slot's
  // accumulator 8-byte aligned. The kernel then copies header, payload and trailer as
  // one iovec instead of three (aggregator.cc QueueResultPacket).
  static constexpr size_t kHeadroom = 32;
  static constexpr size_t kTailroom = 8;

  uint32_t slots() const { return slots_; }
  uint32_t payload_bytes() const { return payload_bytes_; }
  // K x P x 2, what the memory limit counts; the mapping also holds the room above.
  size_t memory_bytes() const { return accum_bytes_; }

  SlotState& state(uint32_t slot, uint32_t shadow) { return states_[slot * 2 + shadow]; }
  // P bytes, with kHeadroom writable bytes before and kTailroom after. Shadow-major:
  // consecutive slots of one shadow set lie back to back, as a rank's run of chunks
  // reaches them (a GSO run is 44 consecutive slots at 1432 B), so that the hardware's
  // stream prefetch fetches the next slot's accumulator rather than the other set's.
  uint8_t* accumulator(uint32_t slot, uint32_t shadow) {
    return accum_ + (size_t(shadow) * slots_ + slot) * stride_ + kHeadroom;
  }
  // Worker bitmap of (slot, shadow): returns true if `rank` was not yet set, and sets it.
  bool TestAndSet(uint32_t slot, uint32_t shadow, uint32_t rank) {
    uint64_t* w = Word(&state(slot, shadow).seen, bitmap_, slot, shadow, rank);
    const uint64_t bit = uint64_t(1) << (rank % 64);
    if (*w & bit) return false;
    *w |= bit;
    return true;
  }
  void ResetRound(uint32_t slot, uint32_t shadow) {
    SlotState& s = state(slot, shadow);
    s.seen = 0;
    s.repeats = 0;
    if (words_ > 1) {
      const size_t at = (size_t(slot) * 2 + shadow) * (words_ - 1);
      std::memset(&bitmap_[at], 0, (words_ - 1) * sizeof(uint64_t));
      std::memset(&repeats_[at], 0, (words_ - 1) * sizeof(uint64_t));
    }
  }
  // Ranks whose contribution came again while the round was still waiting (a resend
  // or tail copy after the first had arrived): their results say so (kExtRepeatSeen).
  void MarkRepeat(uint32_t slot, uint32_t shadow, uint32_t rank) {
    *Word(&state(slot, shadow).repeats, repeats_, slot, shadow, rank) |= uint64_t(1) << (rank % 64);
  }
  bool Repeated(uint32_t slot, uint32_t shadow, uint32_t rank) {
    return (*Word(&state(slot, shadow).repeats, repeats_, slot, shadow, rank) >> (rank % 64)) & 1;
  }

 private:
  // Rank `rank`'s word: in the state's line for ranks 0..63, in `extra` (words_ - 1
  // per (slot, shadow)) beyond.
  uint64_t* Word(uint64_t* first, std::vector<uint64_t>& extra, uint32_t slot, uint32_t shadow,
                 uint32_t rank) {
    if (rank < 64) return first;
    return &extra[(size_t(slot) * 2 + shadow) * (words_ - 1) + rank / 64 - 1];
  }
  uint32_t slots_;
  uint32_t payload_bytes_;
  size_t words_;
  std::vector<SlotState> states_;
  std::vector<uint64_t> bitmap_;   // ranks 64.. (words_ - 1 per (slot, shadow))
  std::vector<uint64_t> repeats_;  // same layout as bitmap_
  // The accumulators: a mapping of their own, so that a job's memory goes back to
  // the system the moment its pool is freed (a heap block could stay in a malloc
  // arena, and RSS would grow as jobs come and go: docs/operations.md).
  size_t accum_bytes_;
  size_t stride_;     // kHeadroom + P + kTailroom
  size_t map_bytes_;  // slots x 2 x stride_
  uint8_t* accum_;
};

// PSN comparison modulo 2^24: is `a` newer than `b`?
inline bool PsnNewer(uint32_t a, uint32_t b) {
  const uint32_t diff = (a - b) & 0xFFFFFF;
  return diff != 0 && diff < 0x800000;
}

}  // namespace netreduce
