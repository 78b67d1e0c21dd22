// The engine's tail repair rules (engine/repair.h).
#include "engine/repair.h"

#include <algorithm>

namespace netreduce {
namespace engine_repair {

bool IsLaneTail(int64_t c, int64_t nchunks, uint64_t base, uint32_t window, uint32_t threads) {
  if (c + 1 >= nchunks) return true;
  if (threads <= 1) return false;
  // Lanes repeat with the window: a later chunk of the lane, if any, is within one.
  const uint64_t lane = (base + uint64_t(c)) % window % threads;
  const int64_t last = std::min<int64_t>(nchunks - 1, c + int64_t(window));
  for (int64_t d = c + 1; d <= last; ++d) {
    if ((base + uint64_t(d)) % window % threads == lane) return false;
  }
  return true;
}

int64_t TailProbeUs(double srtt_us, int64_t floor_us, int64_t rto_us) {
  const int64_t est = srtt_us == 0.0 ? rto_us / 2 : int64_t(2.0 * srtt_us);
  return std::min(rto_us, std::max(floor_us, est));
}

bool CopyTail(uint32_t bytes, uint64_t packets_sent, uint64_t repaired, uint64_t proven) {
  if (bytes > kCopyMaxBytes || packets_sent < kCopyMinPackets) return false;
  const uint64_t lost = repaired > proven ? repaired - proven : 0;
  return double(lost) > kCopyLossThreshold * double(packets_sent);
}

}  // namespace engine_repair
}  // namespace netreduce
