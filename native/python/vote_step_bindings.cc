// The steady step of one tensor (native/algorithms/vote_step.h) as the bindings of the
// algorithms that offer it call it: Engine.vote_step (bindings.cc) and
// Hierarchical.vote_step (hierarchical_bindings.cc), each with its own all-reduce.
#include <pybind11/pybind11.h>

#include <functional>
#include <string>

#include "algorithms/vote_step.h"

namespace py = pybind11;
using namespace netreduce;

namespace {

// `info` in `fmt` ("f" or "d") and C-contiguous, or ValueError naming `what`.
void Check(const py::buffer_info& info, const std::string& fmt, const char* what) {
  if (info.format != fmt) {
    throw py::value_error(std::string(what) + " must have the message buffer's type '" + fmt +
                          "', not '" + info.format + "'");
  }
  ssize_t expect = info.itemsize;
  for (ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] > 1 && info.strides[i] != expect) {
      throw py::value_error(std::string(what) + " must be C-contiguous");
    }
    expect *= info.shape[i];
  }
}

}  // namespace

// Checks the buffers (ValueError), then runs VoteStep without the GIL; the
// all-reduce's Status is returned for the caller's exception mapping.
Status VoteStepCall(py::buffer src, py::buffer buf, py::buffer out, double factor, uint32_t ranks,
                    const std::function<Status(void*, size_t, DType)>& allreduce, int* outcome) {
  py::buffer_info b = buf.request(true);
  DType dt;
  if (b.format == "f" && b.itemsize == 4) {
    dt = DType::kF32;
  } else if (b.format == "d" && b.itemsize == 8) {
    dt = DType::kF64;
  } else {
    throw py::value_error("a steady step's message buffer must be float32 or float64, not '" +
                          b.format + "'");
  }
  Check(b, b.format, "the message buffer");
  py::buffer_info s = src.request(false), o = out.request(true);
  Check(s, b.format, "the source array");
  Check(o, b.format, "the output array");
  if (s.size != o.size || b.size != s.size + 2) {
    throw py::value_error(
        "a steady step needs source and output of n elements and a message "
        "buffer of n + 2; got " +
        std::to_string(s.size) + ", " + std::to_string(o.size) + " and " + std::to_string(b.size));
  }
  py::gil_scoped_release nogil;
  return VoteStep(
      dt, s.ptr, b.ptr, o.ptr, size_t(s.size), factor, ranks,
      [&](void* p, size_t n) { return allreduce(p, n, dt); }, outcome);
}
