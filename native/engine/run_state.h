// What Engine::Run (engine.cc) works in, kept from message to message: per slot, the
// chunk outstanding there and its packet; per lane, the outstanding chunks in sequence
// order; the send queue and the receive buffers. Made once per engine (engine_open.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "transport/transport.h"
#include "wire/roce.h"

namespace netreduce {
namespace engine_run {

constexpr size_t kRecvBatch = 64;        // datagrams per receive, without GRO
constexpr size_t kRecvBufBytes = 65536;  // each one's buffer
// Descriptors for a socket that receives into its own memory (UDP GRO): a 512 KiB
// receive batch holds up to ~360 datagrams at MTU 1500.
constexpr size_t kRecvDescriptors = 512;

struct SlotTrack {
  int64_t chunk = -1;  // -1 = idle
  uint64_t seq = 0;
  int64_t first_send_us = 0;
  int64_t last_send_us = 0;
  // Its place in the engine's transmission order (Engine::Message::tx_): which of two
  // chunks left first even when one receive batch started both in the same
  // microsecond, as happens to every chunk a batch of results starts.
  uint64_t last_tx = 0;
  uint64_t first_tx = 0;  // ... and of its first transmission
  int64_t deadline_us = 0;
  int64_t rto_us = 0;
  uint32_t retries = 0;
  bool early = false;  // deadline set by evidence (overtaken, next expected), not a timeout
  // Sent with no older chunk outstanding in its lane: its round trip is the path's
  // (and the other ranks' lag), not also the wait behind its predecessors.
  bool head = false;
  bool probe = false;  // its early deadline is the tail probe (engine/repair.h)
  bool overtaken = false;  // its early deadline: a later result of its lane came first
  // The aggregator said its round holds this contribution (a held notice): not lost,
  // waiting for other ranks. Only a lost result is left to repair: one probe per
  // kHeldProbeUs, no early deadlines, no round-trip sample from its result.
  bool held = false;
  // A timeout probe asked (AckReq, after the job's first message) whether the round
  // holds this contribution: a held notice then answers a probe, not a first send.
  bool asked = false;
  uint32_t slot = 0;   // its index in RunState::slots
  uint32_t lane = 0;   // slot % threads: the aggregator thread (data port) serving it
  // Shadow bit of the chunk in it: (seq / window) % 2, kept rather than divided per
  // chunk (a slot's next chunk is window sequence numbers on: the bit flips).
  uint8_t shadow = 0;
  uint8_t header[wire::kHeaderBytes];
  uint8_t trailer[8];
  OutPacket pkt;
};

// Packets waiting for the next sendmmsg own copies of their header and trailer: a
// slot's buffers are rewritten when its result arrives and the next chunk starts,
// possibly before a queued (re)transmission of the old chunk has left, and a GSO send
// rewrites a trailer's ICRC in place for its segment's IPv4 ID (two sends of one
// tracker, a tail copy, must not share one).
struct QueuedBytes {
  uint8_t header[wire::kHeaderBytes];
  uint8_t trailer[8];
};

// A lane's outstanding chunks' slots in sequence order, as a ring: results usually
// take the front and new chunks join at the back, each a few instructions (a
// std::deque's segmented indexing and pop_front were a share of the per-chunk cost).
// Holds at most the lane's slots (one outstanding chunk each).
class LaneOrder {
 public:
  void Reset(size_t capacity) {
    size_t cap = 1;
    while (cap < capacity) cap <<= 1;
    buf_.assign(cap, 0);
    mask_ = cap - 1;
    head_ = size_ = 0;
  }
  size_t size() const { return size_; }
  void clear() { head_ = size_ = 0; }
  uint32_t operator[](size_t i) const { return buf_[(head_ + i) & mask_]; }
  // Puts v at position i (0..size()), the ones from i on one place back.
  void insert(size_t i, uint32_t v) {
    if (size_ > mask_) Grow();  // not with one chunk per slot; kept safe all the same
    for (size_t k = size_; k > i; --k) at(k) = at(k - 1);
    at(i) = v;
    ++size_;
  }
  // Removes position i, moving whichever side of it is shorter: a result a place or two
  // out of order (a resend's answer, a descheduled rank, a unicast copy ahead of the
  // group's) moved the whole rest of the lane -- up to a window's worth: at MTU 1500,
  // N=2, up to ~45 % of the engine's user-space instructions per MiB where results came
  // out of order, and most of a job's first message (benchmarks/engine_callgrind.py).
  void erase(size_t i) {
    if (i < size_ - 1 - i) {  // the ones before i move one place back; i == 0: none
      for (size_t k = i; k > 0; --k) at(k) = at(k - 1);
      head_ = (head_ + 1) & mask_;
    } else {
      for (size_t k = i; k + 1 < size_; ++k) at(k) = at(k + 1);
    }
    --size_;
  }

 private:
  uint32_t& at(size_t i) { return buf_[(head_ + i) & mask_]; }
  void Grow() {
    std::vector<uint32_t> b(buf_.size() * 2);
    for (size_t k = 0; k < size_; ++k) b[k] = at(k);
    buf_.swap(b);
    mask_ = buf_.size() - 1;
    head_ = 0;
  }
  std::vector<uint32_t> buf_;
  size_t mask_ = 0, head_ = 0, size_ = 0;
};

}  // namespace engine_run

struct Engine::RunState {
  std::vector<engine_run::SlotTrack> slots;  // by slot; chunk -1 = idle (all, between messages)
  // Per lane, its outstanding chunks' slots in sequence order: who a result overtook,
  // who is next expected, and whether a chunk starts at its lane's head, in O(1) for
  // the usual in-order result instead of a scan of the window.
  std::vector<engine_run::LaneOrder> lane_order;
  // The send queue as SendBatch takes it, and beside it each packet's own header and
  // trailer (Flush points the packet at them: the vector may move as it grows).
  std::vector<OutPacket> sendq;
  std::vector<engine_run::QueuedBytes> sendq_bytes;
  // Receive buffers (kRecvBatch x 64 KiB) and scratch; not cleared, so pages are
  // touched only where datagrams land (a GRO socket never uses them for receives).
  std::unique_ptr<uint8_t[]> storage;
  std::vector<InPacket> in;
  // Per lane, wire::IcrcSeed of a full chunk's datagram to its data port, for chunks
  // of icrc_seed_len payload bytes (a message's every chunk but maybe its last).
  std::vector<uint32_t> icrc_seed;
  size_t icrc_seed_len = ~size_t(0);
  bool clean = true;  // false while a message runs (an error leaves it so)
};

}  // namespace netreduce
