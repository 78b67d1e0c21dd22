// The steady step of one tensor in one call (netreduce/worker/speculation.py,
// Speculation.run_lone): the speculative message [vote | other | data] of a rank that
// has submitted the armed group's lone tensor and nothing else -- its vote 1, its
// `other` 0, its data -- summed in place across the ranks by any all-reduce. The sums
// say the same to every rank: the vote is N only if every rank contributed the data,
// and only then is the sum copied out, times `factor` (Average, postscale) in the
// tensor's own float type, as numpy multiplies it on the Python path; otherwise the
// output is left as it was. Votes are exact: float32 and float64 count every N a job
// can have (wire::kMaxRanks) exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/status.h"
#include "reduce/dtype.h"

namespace netreduce {

// What the sums said.
enum VoteOutcome : int {
  kVoteDiscarded = 0,      // not every rank voted: the sums are no result
  kVoteComplete = 1,       // the result, in `out`; no rank had anything else
  kVoteCompleteOther = 2,  // the result, in `out`; some rank has more to say (a round next)
};

// `buf` holds 2 + count elements of `dt` (kF32 or kF64), `src` and `out` count each;
// `out` may be `src`, neither may overlap `buf`. `allreduce(buf, elements)` sums
// `buf` in place across the job's `ranks` ranks.
Status VoteStep(DType dt, const void* src, void* buf, void* out, size_t count, double factor,
                uint32_t ranks, const std::function<Status(void*, size_t)>& allreduce,
                int* outcome);

}  // namespace netreduce
