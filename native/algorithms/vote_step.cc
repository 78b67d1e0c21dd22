#include "algorithms/vote_step.h"

#include <cstring>
#include <string>

namespace netreduce {
namespace {

template <typename T>
Status Run(const T* src, T* buf, T* out, size_t count, double factor, uint32_t ranks,
           const std::function<Status(void*, size_t)>& allreduce, int* outcome) {
  buf[0] = T(1);  // this rank's vote
  buf[1] = T(0);  // nothing else to say (the caller checked)
  std::memcpy(buf + 2, src, count * sizeof(T));
  NR_RETURN_IF_ERROR(allreduce(buf, count + 2));
  if (buf[0] != T(ranks)) {
    *outcome = kVoteDiscarded;
    return Status::Ok();
  }
  const T* sum = buf + 2;
  if (factor == 1.0) {
    std::memcpy(out, sum, count * sizeof(T));
  } else {
    // numpy's float32 multiply by a Python float: the factor rounded to T once, the
    // product in T (the Python path's np.multiply, bit for bit).
    const T f = T(factor);
    for (size_t i = 0; i < count; ++i) out[i] = sum[i] * f;
  }
  *outcome = buf[1] != T(0) ? kVoteCompleteOther : kVoteComplete;
  return Status::Ok();
}

}  // namespace

Status VoteStep(DType dt, const void* src, void* buf, void* out, size_t count, double factor,
                uint32_t ranks, const std::function<Status(void*, size_t)>& allreduce,
                int* outcome) {
  switch (dt) {
    case DType::kF32:
      return Run(static_cast<const float*>(src), static_cast<float*>(buf), static_cast<float*>(out),
                 count, factor, ranks, allreduce, outcome);
    case DType::kF64:
      return Run(static_cast<const double*>(src), static_cast<double*>(buf),
                 static_cast<double*>(out), count, factor, ranks, allreduce, outcome);
    default:
      return InvalidArgument(std::string("a steady step carries float32 or float64, not ") +
                             DTypeName(dt));
  }
}

}  // namespace netreduce
