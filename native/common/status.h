// Status: the one error type of the native data plane. Library code never aborts
// the process; an error travels up as a Status and becomes a Python exception in
// bindings.cc. Messages name what a user must act on (address, job, rank, slot).
#pragma once

#include <string>
#include <utility>

namespace netreduce {

enum class Code { kOk = 0, kInvalidArgument, kTimeout, kIo, kAborted, kRefused };

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
inline Status Timeout(std::string m) { return Status(Code::kTimeout, std::move(m)); }
inline Status IoError(std::string m) { return Status(Code::kIo, std::move(m)); }
inline Status Aborted(std::string m) { return Status(Code::kAborted, std::move(m)); }

}  // namespace netreduce

// Propagate a non-OK Status to the caller (NCCL's NCCLCHECK, gloo's GLOO_ENFORCE).
#define NR_RETURN_IF_ERROR(expr)              \
  do {                                        \
    ::netreduce::Status _nr_st = (expr);      \
    if (!_nr_st.ok()) return _nr_st;          \
  } while (0)
