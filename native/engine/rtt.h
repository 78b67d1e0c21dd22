// The worker's loss-recovery clock: the round-trip estimate (RFC 6298 style) that
// sets a chunk's timeout, and the inter-result gap that dates the next expected
// result (engine.cc's loop essay says how both are used).
#pragma once

#include <cstdint>

namespace netreduce {
namespace engine_timing {

constexpr int64_t kMaxRtoUs = 1000000;
constexpr int64_t kInitialRtoUs = 5000;  // before the first round-trip sample
constexpr int64_t kReorderFloorUs = 50;  // least reorder window of an overtaken chunk

}  // namespace engine_timing
}  // namespace netreduce
