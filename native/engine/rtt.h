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
constexpr int64_t kInitialRtoUs = 5000;  // before the first round-trip sample
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

}  // namespace engine_timing
}  // namespace netreduce
