// netreduce's TensorFlow graph ops: asynchronous kernels that hand their tensors to
// the netreduce core and return at once.
//
// Why asynchronous: a collective completes only when every rank has submitted the
// same tensor, and TensorFlow runs a graph's independent nodes in an order of its
// own choosing, which differs from rank to rank. A kernel that blocked its
// inter-op thread until the collective finished (what a tf.numpy_function body
// does) could fill the pool with collectives that wait for ranks whose pool is
// filled with other collectives: a deadlock that no timeout fixes. Here
// ComputeAsync only queues the request (one mutex, no wait) and returns; the
// core's negotiation orders tensors submitted in any order, and `done` is called
// when the core's handle completes. No TensorFlow thread ever waits for a peer.
//
// Who does what:
//   * ComputeAsync (a TensorFlow thread): for allreduce/broadcast, forwards the
//     input buffer as the output or copies it there (the core then works in place
//     on the output); records inputs, outputs and the op's `spec` (a JSON string
//     the Python side wrote at graph-construction time) under a request id and
//     wakes the bridge.
//   * the bridge (one Python thread of netreduce.tensorflow, op_bridge.py): blocks
//     in nrtf_next() with the GIL released, reads a request with nrtf_request(),
//     submits it to the core without waiting, allocates outputs whose shape is
//     known only then (allgather, alltoall, reducescatter) with nrtf_allocate().
//   * completion (the core thread that finishes the handle): copies results that
//     were not written in place and calls nrtf_done(), which sets the status and
//     calls TensorFlow's `done` (TensorFlow schedules the successors on its pool).
//
// The data plane stays native: only pointers and shapes cross into Python.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace netreduce_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// One pending kernel invocation. `context` stays valid until `done` is called.
struct Request {
  OpKernelContext* context = nullptr;
  AsyncOpKernel::DoneCallback done;
  const std::string* spec = nullptr;  // owned by the kernel, which outlives the call
  // Flat description read by the bridge (int64 words): input count, then per
  // input: dtype (TensorFlow's DataType enum), rank, dims..., input address,
  // preallocated output address (0 when the bridge allocates it).
  std::vector<int64_t> desc;
};

// Heap-allocated and never destroyed: the bridge thread may still sit in
// nrtf_next() while the process exits, and a destroyed condition variable under
// a waiter is undefined behaviour.
struct Queue {
  std::mutex mu;
  std::condition_variable ready;
  std::deque<int64_t> fresh;  // ids not yet taken by the bridge
  std::unordered_map<int64_t, Request> pending;  // taken or not, until done
  int64_t next_id = 1;
  bool stopped = false;
};

Queue& queue() {
  static Queue* q = new Queue;
  return *q;
}

void fail_now(OpKernelContext* ctx, const AsyncOpKernel::DoneCallback& done,
              const std::string& message) {
  ctx->SetStatus(absl::FailedPreconditionError(message));
  done();
}

class CollectiveOp : public AsyncOpKernel {
 public:
  explicit CollectiveOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("spec", &spec_));
    const std::string& type = ctx->def().op();
    in_place_ = type == "NetreduceAllreduce" || type == "NetreduceBroadcast";
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Request req;
    req.context = ctx;
    req.spec = &spec_;
    const int n = ctx->num_inputs();
    req.desc.reserve(1 + n * 8);
    req.desc.push_back(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& in = ctx->input(i);
      int64_t out_addr = 0;
      if (in_place_) {
        Tensor* out = nullptr;
        OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({i}, i, in.shape(), &out),
                             done);
        // The core reduces in place on the output: start it from the input.
        if (out->data() != in.data() && in.TotalBytes() > 0) {
          std::memcpy(out->data(), in.data(), in.TotalBytes());
        }
        out_addr = reinterpret_cast<int64_t>(out->data());
      }
      req.desc.push_back(static_cast<int64_t>(in.dtype()));
      req.desc.push_back(in.dims());
      for (int d = 0; d < in.dims(); ++d) req.desc.push_back(in.dim_size(d));
      req.desc.push_back(reinterpret_cast<int64_t>(in.data()));
      req.desc.push_back(out_addr);
    }
    req.done = std::move(done);
    Queue& q = queue();
    {
      std::lock_guard<std::mutex> lock(q.mu);
      if (!q.stopped) {
        const int64_t id = q.next_id++;
        q.pending.emplace(id, std::move(req));
        q.fresh.push_back(id);
        q.ready.notify_one();
        return;
      }
    }
    fail_now(ctx, req.done,
             "netreduce.tensorflow: the op bridge has stopped (interpreter shutting down); "
             "no collective can start");
  }

 private:
  std::string spec_;
  bool in_place_ = false;
};

absl::Status same_shapes(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

// allgather/reducescatter: the first dimension is known only once every rank's
// is (allgather) or is set by the Python side from the process set's size.
absl::Status unknown_first_dim(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) {
    ShapeHandle in = c->input(i), out;
    if (c->RankKnown(in) && c->Rank(in) == 0) {
      c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      continue;
    }
    TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
    c->set_output(i, out);
  }
  return absl::OkStatus();
}

absl::Status alltoall_shapes(InferenceContext* c) {
  ShapeHandle in = c->input(0), out;
  if (c->RankKnown(in) && c->Rank(in) == 0) {
    out = c->Vector(InferenceContext::kUnknownDim);
  } else {
    TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
  }
  c->set_output(0, out);
  c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
  return absl::OkStatus();
}

}  // namespace netreduce_tf

// Every op is stateful (never constant-folded, deduplicated or pruned by
// Grappler); the Python side marks each one independent of the others for
// tf.function's automatic control dependencies, so they need not run in program
// order. `spec` carries the tensor name, reduction and factors, root rank and
// process set (JSON, written by op_bridge.spec()).
#define NETREDUCE_TYPES \
  "{int8, uint8, int16, uint16, int32, uint32, int64, half, bfloat16, float, double, bool}"

// A collective over a list of tensors (one output each, shapes by SHAPES) and its CPU
// kernel: every op but alltoall, which takes one tensor and its splits.
#define NETREDUCE_LIST_OP(NAME, SHAPES)          \
  REGISTER_OP(NAME)                              \
      .Input("tensors: T")                       \
      .Output("outputs: T")                      \
      .Attr("T: list(" NETREDUCE_TYPES ") >= 1") \
      .Attr("spec: string")                      \
      .SetIsStateful()                           \
      .SetShapeFn(SHAPES);                       \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(tensorflow::DEVICE_CPU), netreduce_tf::CollectiveOp)

NETREDUCE_LIST_OP("NetreduceAllreduce", netreduce_tf::same_shapes);
NETREDUCE_LIST_OP("NetreduceBroadcast", netreduce_tf::same_shapes);
NETREDUCE_LIST_OP("NetreduceAllgather", netreduce_tf::unknown_first_dim);
NETREDUCE_LIST_OP("NetreduceReducescatter", netreduce_tf::unknown_first_dim);

REGISTER_OP("NetreduceAlltoall")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .Attr("T: " NETREDUCE_TYPES)
    .Attr("spec: string")
    .SetIsStateful()
    .SetShapeFn(netreduce_tf::alltoall_shapes);
REGISTER_KERNEL_BUILDER(Name("NetreduceAlltoall").Device(tensorflow::DEVICE_CPU),
                        netreduce_tf::CollectiveOp);

// --- the bridge's C interface (ctypes, op_bridge.py) ---------------------------------
extern "C" {

// The next request id; blocks (the caller released the GIL) until one comes or
// timeout_ms passes (0 then), -1 once nrtf_stop() was called.
__attribute__((visibility("default"))) int64_t nrtf_next(int64_t timeout_ms) {
  netreduce_tf::Queue& q = netreduce_tf::queue();
  std::unique_lock<std::mutex> lock(q.mu);
  q.ready.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                   [&] { return q.stopped || !q.fresh.empty(); });
  if (q.stopped) return -1;
  if (q.fresh.empty()) return 0;
  const int64_t id = q.fresh.front();
  q.fresh.pop_front();
  return id;
}

// The request's spec (NUL-terminated) and description words; 0 if unknown.
__attribute__((visibility("default"))) int nrtf_request(int64_t id, const char** spec,
                                                        const int64_t** desc, int64_t* words) {
  netreduce_tf::Queue& q = netreduce_tf::queue();
  std::lock_guard<std::mutex> lock(q.mu);
  auto it = q.pending.find(id);
  if (it == q.pending.end()) return 0;
  *spec = it->second.spec->c_str();
  *desc = it->second.desc.data();
  *words = static_cast<int64_t>(it->second.desc.size());
  return 1;
}

// Allocate output `index` of request `id` with the given shape; returns its
// address (a valid non-null placeholder for zero elements is not promised: check
// the size), or 0 with *error set (the allocation failed or the id is unknown).
__attribute__((visibility("default"))) int64_t nrtf_allocate(int64_t id, int index, int rank,
                                                             const int64_t* dims, int* error) {
  netreduce_tf::Queue& q = netreduce_tf::queue();
  tensorflow::OpKernelContext* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    auto it = q.pending.find(id);
    if (it != q.pending.end()) ctx = it->second.context;
  }
  *error = 1;
  if (ctx == nullptr) return 0;
  tensorflow::TensorShape shape;
  for (int d = 0; d < rank; ++d) {
    if (!shape.AddDimWithStatus(dims[d]).ok()) return 0;
  }
  tensorflow::Tensor* out = nullptr;
  if (!ctx->allocate_output(index, shape, &out).ok()) return 0;
  *error = 0;
  return reinterpret_cast<int64_t>(out->data());
}

// Finish request `id`: status `code` (absl::StatusCode; 0 = OK) with `message`,
// then TensorFlow's done callback. Called once per request.
__attribute__((visibility("default"))) void nrtf_done(int64_t id, int code, const char* message) {
  netreduce_tf::Queue& q = netreduce_tf::queue();
  netreduce_tf::Request req;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    auto it = q.pending.find(id);
    if (it == q.pending.end()) return;
    req = std::move(it->second);
    q.pending.erase(it);
  }
  if (code != 0) {
    req.context->SetStatus(absl::Status(static_cast<absl::StatusCode>(code), message));
  }
  req.done();
}

// Stop handing out requests: nrtf_next returns -1 from now on, and requests not
// yet taken fail (the bridge is going away with the interpreter).
__attribute__((visibility("default"))) void nrtf_stop() {
  netreduce_tf::Queue& q = netreduce_tf::queue();
  std::deque<int64_t> orphans;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.stopped = true;
    orphans.swap(q.fresh);
    q.ready.notify_all();
  }
  for (int64_t id : orphans) {
    nrtf_done(id, static_cast<int>(absl::StatusCode::kAborted),
              "netreduce.tensorflow: the interpreter is shutting down; collective not started");
  }
}

// Requests not yet taken by the bridge (it runs a ready step itself only when none is).
__attribute__((visibility("default"))) int64_t nrtf_queued() {
  netreduce_tf::Queue& q = netreduce_tf::queue();
  std::lock_guard<std::mutex> lock(q.mu);
  return static_cast<int64_t>(q.fresh.size());
}

// Requests submitted and not yet done (tests, shutdown diagnostics).
__attribute__((visibility("default"))) int64_t nrtf_pending() {
  netreduce_tf::Queue& q = netreduce_tf::queue();
  std::lock_guard<std::mutex> lock(q.mu);
  return static_cast<int64_t>(q.pending.size());
}

}  // extern "C"
