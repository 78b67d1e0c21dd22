// The worker's loss-recovery clock: the round-trip estimate (RFC 6298 style) that
// sets a chunk's timeout, and the inter-result gap that dates the next expected
// result (engine/repair.h says how both are used).
#pragma once

#include <chrono>
#include <cstdint>

namespace netreduce {
namespace engine_timing {

inline int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr int64_t kMaxRtoUs = 1000000;
// The timeout before the first round-trip sample (a tail probe fires at half of it).
// A job's first message is the one without a sample, and it asks for held notices
// (docs/protocol.md, "Held notices"): what ends its wait is that notice, whose round
// trip is the path's plus the scheduling of two busy hosts -- the aggregator's thread
// and the rank's engine. With 1,000 rank threads on 2 shared cores that was 1-11 ms
// for 90 % of the ranks and up to 30 ms (BENCHMARKS.md, issue 33, "1,000 ranks: the
// first timeout"), and at 5 ms the tail probe (2.5 ms) resent up to 1.0 packets per
// rank needlessly (0.46 in the median). 50 ms is still far below TCP's first 1 s
// (RFC 6298) and QUIC's 333 ms initial RTT; a first contribution really lost is
// resent after 25 ms, not 2.5 ms, once per engine (the first sample ends it).
constexpr int64_t kInitialRtoUs = 50000;
// The most the first sample may be (later ones: 4 srtt): a notice that answered a
// resend overstates the round trip, and a first timeout of the 1 s cap made dozens of
// chunks wait that long for a loss.
constexpr int64_t kFirstSampleCapUs = 5000;
constexpr int64_t kReorderFloorUs = 50;  // least reorder window of an overtaken chunk
// The reorder window of an overtaken chunk is srtt/4 times a step count (RACK's
// reo_wnd_steps, RFC 8985 6.2): each resend proven needless by a second result (the
// original's result was only late: reordering, or a descheduled sender on a loaded
// host) widens it by a step, up to kMaxReorderSteps; kReorderQuietMessages messages
// without one narrow it back to a single step.
constexpr uint32_t kMaxReorderSteps = 8;
constexpr uint32_t kReorderQuietMessages = 16;
// A held chunk's probe interval (engine.cc, held notices), doubling up to the cap: it
// waits for other ranks, and only its result, once sent, can be lost.
constexpr int64_t kHeldProbeUs = kMaxRtoUs;
constexpr int64_t kMaxHeldProbeUs = 8 * kMaxRtoUs;
// A lane quiet for a timeout probes its oldest chunk asking for a held notice; each
// notice sends the next oldest's probe at once, up to this many per quiet spell (then
// one per backed-off timeout again): a lane waiting for a descheduled peer, every round
// of it waiting, asks a few more, not its whole share of the window one by one.
constexpr uint32_t kMaxProbeWalk = 4;

}  // namespace engine_timing
}  // namespace netreduce
