// What Engine::Run (engine.cc) works in, kept from message to message: per slot, the
// chunk outstanding there and its packet; per lane, the outstanding chunks in sequence
// order; the send queue and the receive buffers. Made once per engine (engine_open.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
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
  uint32_t lane = 0;   // slot % threads: the aggregator thread (data port) serving it
  uint8_t header[wire::kHeaderBytes];
  uint8_t trailer[8];
  OutPacket pkt;
};

// Packets waiting for the next sendmmsg own copies of their header and trailer: a
// slot's buffers are rewritten when its result arrives and the next chunk starts,
// possibly before a queued (re)transmission of the old chunk has left.
struct Queued {
  OutPacket pkt;
  uint8_t header[wire::kHeaderBytes];
  uint8_t trailer[8];
};

}  // namespace engine_run

struct Engine::RunState {
  std::vector<engine_run::SlotTrack> slots;  // by slot; chunk -1 = idle (all, between messages)
  // Per lane, its outstanding chunks' slots in sequence order: who a result overtook,
  // who is next expected, and whether a chunk starts at its lane's head, in O(1) for
  // the usual in-order result instead of a scan of the window.
  std::vector<std::deque<uint32_t>> lane_order;
  std::vector<engine_run::Queued> sendq;
  std::vector<OutPacket> batch;
  // Receive buffers (kRecvBatch x 64 KiB) and scratch; not cleared, so pages are
  // touched only where datagrams land (a GRO socket never uses them for receives).
  std::unique_ptr<uint8_t[]> storage;
  std::vector<InPacket> in;
  bool clean = true;  // false while a message runs (an error leaves it so)
};

}  // namespace netreduce
