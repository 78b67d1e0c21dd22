// The engine's round-trip and inter-result-gap estimators (engine/rtt.h).
#include <algorithm>
#include <cmath>

#include "engine/engine.h"
#include "engine/rtt.h"

namespace netreduce {

using namespace engine_timing;

void Engine::SampleRtt(double sample_us) {
  // One sample moves the estimate at most to 4 srtt (kFirstSampleCapUs the first):
  // a round trip that waited for a rank still starting up, or one descheduled on a
  // loaded host, would otherwise set the timeout to the 1 s cap for dozens of chunks.
  // A longer path is still learnt, by a factor of about 1.4 per sample.
  if (srtt_us_ == 0.0) first_rtt_stat_us_ = uint64_t(sample_us);  // as measured (Stats)
  sample_us = std::min(sample_us, srtt_us_ == 0.0 ? double(kFirstSampleCapUs) : 4.0 * srtt_us_);
  min_rtt_us_ = min_rtt_us_ == 0 ? int64_t(sample_us) : std::min(min_rtt_us_, int64_t(sample_us));
  if (srtt_us_ == 0.0) {
    srtt_us_ = sample_us;
    rttvar_us_ = sample_us / 2;
  } else {
    rttvar_us_ = 0.75 * rttvar_us_ + 0.25 * std::abs(srtt_us_ - sample_us);
    srtt_us_ = 0.875 * srtt_us_ + 0.125 * sample_us;
  }
  srtt_stat_us_ = uint64_t(srtt_us_);
  rto_stat_us_ = uint64_t(Rto());
}

void Engine::SampleGap(double sample_us) {
  if (gap_us_ == 0.0) {
    gap_us_ = sample_us;
    gapvar_us_ = sample_us / 2;
  } else {
    gapvar_us_ = 0.75 * gapvar_us_ + 0.25 * std::abs(gap_us_ - sample_us);
    gap_us_ = 0.875 * gap_us_ + 0.125 * sample_us;
  }
}

int64_t Engine::GapTimeout() const {
  // Before the first gap sample: a quarter of the timeout, as for an overtaken chunk.
  const int64_t est = gap_us_ == 0.0 ? Rto() / 4 : int64_t(gap_us_ + 4.0 * gapvar_us_);
  return std::max(kReorderFloorUs, est);
}

int64_t Engine::Rto() const {
  const int64_t floor = int64_t(cfg_.retransmit_ms * 1000.0);
  const int64_t est = srtt_us_ == 0.0 ? kInitialRtoUs : int64_t(srtt_us_ + 4.0 * rttvar_us_);
  return std::min(std::max(floor, est), kMaxRtoUs);
}

}  // namespace netreduce
