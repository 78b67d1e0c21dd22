// The engine loop.
//
// A message of `count` elements is cut into chunks of P / accumulator-width
// elements. Chunk c gets the sequence number seq = base + c; it travels in slot
// seq % W with shadow bit (seq / W) % 2 and PSN seq mod 2^24. Sequence numbers run on
// across messages, so consecutive messages never meet the same (slot, shadow) round.
// Self-clocking: at most one chunk per slot is outstanding; when a slot's result
// arrives, the result is copied into place and the chunk W further on is sent in
// the same slot. A resend is always the very same packet, and always safe: the
// aggregator adds a contribution once.
//
// Loss recovery: engine/repair.h (the rules, and where each hooks into the steps).
// A chunk without a result for timeout_s fails the operation, naming the aggregator,
// job, rank and slot. After a failure the engine's sequence is out of step with the
// job, so it refuses further work.
//
// The steps (Engine::Message, engine/message.h): the first window goes out; then,
// until every chunk is answered, the queued packets leave in one batch, the thread
// sleeps until a socket holds results or a deadline comes, each socket is drained
// (every result starts its slot's next chunk), and the timers are swept.
#include "engine/engine.h"

#include <string>

#include "engine/message.h"
#include "engine/prefetch.h"
#include "engine/rtt.h"

namespace netreduce {
using namespace engine_timing;
using namespace engine_prefetch;
using namespace engine_run;

Status Engine::CheckRequest(const Request& req) const {
  if (!ValidDType(uint8_t(req.dtype)) || !ValidOp(uint8_t(req.op))) {
    return InvalidArgument("unknown dtype or op code");
  }
  if (req.scale != 1.0 && (req.op != Op::kSum || req.owner != -1 ||
                           (req.dtype != DType::kF32 && req.dtype != DType::kF64))) {
    return InvalidArgument(std::string("a scaled result is a float32 or float64 sum into "
                                       "every rank, not ") +
                           DTypeName(req.dtype) + " " + OpName(req.op) +
                           (req.owner != -1 ? " with an owner" : ""));
  }
  if (req.count == 0) return Status::Ok();
  const size_t chunk_elems = cfg_.payload_bytes / AccumSize(req.dtype);
  const uint64_t nchunks = uint64_t((req.count + chunk_elems - 1) / chunk_elems);
  if (req.count - 1 > wire::kMaxOffset) {
    return InvalidArgument("message of " + std::to_string(req.count) +
                           " elements exceeds the 2^40-element offset field");
  }
  if (nchunks > sock_->MaxMessageChunks()) {
    return InvalidArgument("message of " + std::to_string(nchunks) + " chunks exceeds the " +
                           std::to_string(sock_->MaxMessageChunks()) + " this transport carries");
  }
  if (req.owner >= int32_t(cfg_.size)) {
    return InvalidArgument("reduce-scatter owner " + std::to_string(req.owner) +
                           " is not a rank of a job of " + std::to_string(cfg_.size));
  }
  return Status::Ok();
}

Status Engine::Run(Request& req) {
  NR_RETURN_IF_ERROR(CheckRequest(req));
  if (req.count == 0) return Status::Ok();
  Message m(*this, req);
  m.StartWindow();
  while (!m.Done()) {
    NR_RETURN_IF_ERROR(m.Flush());
    if (aborted_) {
      std::lock_guard<std::mutex> lock(mu_);
      return Aborted(abort_reason_);
    }
    NR_RETURN_IF_ERROR(m.AwaitResults());
    // The group's results first: they are the lanes' ordered stream, and a unicast
    // result (a copy, the answer to a resend) handled ahead of the group's backlog
    // would start its slot's next chunk ahead of the others' (message_results.cc,
    // Complete).
    if (group_) NR_RETURN_IF_ERROR(m.Drain(*group_));
    NR_RETURN_IF_ERROR(m.Drain(*sock_));
    NR_RETURN_IF_ERROR(m.SweepTimers());
  }
  NR_RETURN_IF_ERROR(m.DrainSkipped(*sock_));
  m.Finish();
  return Status::Ok();
}

Engine::Message::Message(Engine& e, Request& req)
    : e_(e),
      req_(req),
      rs_(*e.run_),
      slots_(e.run_->slots),
      esize_(ElementSize(req.dtype)),
      chunk_elems_(e.cfg_.payload_bytes / AccumSize(req.dtype)),
      full_bytes_(chunk_elems_ * esize_),
      nchunks_(int64_t((req.count + chunk_elems_ - 1) / chunk_elems_)),
      counter_(e.next_msg_++),
      interleaved_(req.owner == kInterleavedOwners),
      // Results of a large message with large chunks go into dst by streaming stores
      // (prefetch.h); 1432-byte chunks do better with plain stores and dst prefetched.
      // A scaled result is multiplied on its way in, with plain stores.
      stream_(req.scale == 1.0 && req.count * esize_ >= kStreamMinBytes &&
              chunk_elems_ * esize_ >= kStreamMinChunk),
      base_(e.next_seq_),
      // The first timeout of a chunk follows the measured round trip (Rto()). Under CPU
      // contention a round trip on loopback can take tens of ms (queues of N workers'
      // windows at the aggregator, and the slowest rank sets the pace): rttvar and the
      // spurious-resend samples raise it then, and the stall rule of the sweep keeps
      // what fires anyway to one packet per backed-off timeout.
      timeout_us_(int64_t(e.cfg_.timeout_s * 1e6)),
      retransmits_at_start_(e.retransmits_),
      remaining_(nchunks_),
      lane_progress_(e.cfg_.threads, 0),
      next_probe_(e.cfg_.threads, 0),
      lane_last_seq_(e.cfg_.threads, -1),
      probe_walk_(e.cfg_.threads, 0),
      lane_backoff_(e.cfg_.threads, 0),
      walk_now_(e.cfg_.threads, 0),
      probes_(e.cfg_.threads, nullptr),
      held_probes_(e.cfg_.threads, nullptr),
      nap_(uint64_t(std::min<int64_t>(nchunks_, int64_t(e.window_))),
           uint64_t(kGroBufBytes / wire::DatagramBytes(e.cfg_.payload_bytes)),
           e.nap_rest_.Start()) {
  e.next_seq_ += uint64_t(nchunks_);
  e.messages_++;
  if (!rs_.clean) {  // a failed message left chunks behind (the engine refuses work after
    for (SlotTrack& t : slots_) t.chunk = -1;  // one, but a message must not trust stale state)
    for (auto& q : rs_.lane_order) q.clear();
  }
  rs_.clean = false;
  rs_.sendq.clear();
  rs_.sendq_bytes.clear();
}

void Engine::Message::Finish() {
  rs_.clean = true;
  // The reorder window narrows again after kReorderQuietMessages messages in which no
  // resend proved needless by a second result (engine_timing::kMaxReorderSteps).
  if (e_.late_seen_) {
    e_.reorder_quiet_ = 0;
  } else if (++e_.reorder_quiet_ >= kReorderQuietMessages) {
    e_.reorder_steps_ = 1;
    e_.reorder_quiet_ = 0;
  }
  e_.late_seen_ = false;
  // Its naps cost throughput: it stopped; kOffStrikes in a row, the next messages rest.
  if (nap_.Off()) Bump(e_.nap_offs_);
  e_.nap_rest_.Judged(nap_.Off(), nap_.Kept());
}

}  // namespace netreduce
