// The engine's request queue and its thread: Submit/Wait/Abort on the caller's side,
// ThreadMain running one request at a time (Engine::Run in engine.cc); the counters
// and the words that name this engine in errors.
#include <pthread.h>

#include <string>

#include "engine/engine.h"

namespace netreduce {

std::string Engine::AggregatorAddress() const {
  const std::string port = std::to_string(cfg_.port);  // IPv6 in brackets: "[fd00::1]:4791"
  return cfg_.host.find(':') != std::string::npos ? "[" + cfg_.host + "]:" + port
                                                  : cfg_.host + ":" + port;
}

std::string Engine::DataPath() const { return sock_ ? sock_->Describe() : ""; }

size_t Engine::ReceiveBufferBytes() const { return sock_ ? sock_->ReceiveBufferBytes() : 0; }

std::string Engine::Where(uint32_t slot) const {
  return "aggregator " + AggregatorAddress() + ", job '" + cfg_.job + "' (index " +
         std::to_string(cfg_.job_index) + "), rank " + std::to_string(cfg_.rank) + "/" +
         std::to_string(cfg_.size) + ", slot " + std::to_string(slot);
}

std::shared_ptr<Engine::Request> Engine::Submit(const void* src, void* dst, size_t count,
                                                 DType dt, Op op, int32_t owner,
                                                 double scale) {
  auto r = std::make_shared<Request>();
  r->src = static_cast<const uint8_t*>(src);
  r->dst = static_cast<uint8_t*>(dst);
  r->count = count;
  r->dtype = dt;
  r->op = op;
  r->owner = owner;
  r->scale = scale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(r);
  }
  cv_.notify_all();
  return r;
}

bool Engine::Done(Request& r) {
  std::lock_guard<std::mutex> lock(r.mu);
  return r.done;
}

Status Engine::Wait(Request& r) {
  std::unique_lock<std::mutex> lock(r.mu);
  r.cv.wait(lock, [&] { return r.done; });
  return r.status;
}

void Engine::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_) abort_reason_ = reason;
    aborted_ = true;
  }
  cv_.notify_all();
}

std::map<std::string, uint64_t> Engine::Stats() const {
  return {{"packets_sent", packets_sent_.load()},     {"packets_received", packets_received_.load()},
          {"retransmits", retransmits_.load()},       {"dropped_by_knob", dropped_by_knob_.load()},
          {"ignored_results", ignored_results_.load()}, {"bytes_sent", bytes_sent_.load()},
          {"messages", messages_.load()},
          {"fast_retransmits", fast_retransmits_.load()},
          {"spurious_retransmits", spurious_retransmits_.load()},
          {"timeout_probes", timeout_probes_.load()},
          {"tail_probes", tail_probes_.load()},       {"tail_copies", tail_copies_.load()},
          {"repaired_chunks", repaired_chunks_.load()}, {"repair_wait_us", repair_wait_us_.load()},
          {"needless_by_repeat", needless_by_repeat_.load()},
          {"held_notices", held_notices_.load()}, {"held_probes", held_probes_.load()},
          {"probe_notices", probe_notices_.load()},
          {"group_datagrams", group_datagrams_.load()},
          {"waits", waits_.load()},
          {"naps", naps_.load()},
          {"nap_us", nap_us_.load()},
          {"nap_offs", nap_offs_.load()},
          {"overtaken_resends", overtaken_resends_.load()},
          {"gap_resends", gap_resends_.load()},
          {"srtt_us", srtt_stat_us_.load()},
          {"rto_us", rto_stat_us_.load()},
          {"first_rtt_us", first_rtt_stat_us_.load()}};
}

void Engine::ThreadMain() {
  pthread_setname_np(pthread_self(), "nr-engine");  // top/perf, benchmarks/linerate.py
  for (;;) {
    std::shared_ptr<Request> r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || aborted_ || !queue_.empty(); });
      if (queue_.empty()) {
        if (stopping_) return;
        if (aborted_) {
          cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
          if (queue_.empty()) return;
        }
      }
      r = queue_.front();
      queue_.pop_front();
    }
    Status st;
    if (aborted_) {
      std::lock_guard<std::mutex> lock(mu_);
      st = Aborted(abort_reason_);
    } else if (!poisoned_.ok()) {
      st = Status(poisoned_.code(), "engine unusable after an earlier failure: " + poisoned_.message());
    } else {
      st = Run(*r);
      if (!st.ok() && st.code() != Code::kInvalidArgument) poisoned_ = st;
    }
    {
      std::lock_guard<std::mutex> lock(r->mu);
      r->status = st;
      r->done = true;
    }
    r->cv.notify_all();
  }
}

}  // namespace netreduce
