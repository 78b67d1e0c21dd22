// The hierarchical ("parallel") all-reduce of one host: reduce-scatter through shared
// memory, each local rank's shard through its own engine (its own aggregator
// sub-job, one per local rank index across the hosts), all-gather through shared
// memory. With no engine (a single host) the shard is final after the local reduce.
//
// The buffer goes in chunks of segment chunk_bytes; chunk serial s (counting across
// calls; identical on every local rank because every rank runs the same calls in the
// same order) uses ring slot s % depth. Per chunk, local rank j:
//
//   A1  waits until every rank has reduced chunk s - depth      (input slot free)
//   A2  copies its contribution, except its own shard, into input[j][slot]; posted[j] = s
//   A3  waits for every posted >= s, and every gathered >= s - depth (result slot free)
//   A4  reduces its shard from every input (its own straight from its buffer) into
//       result[slot] — local ranks in order 0..L-1, 16-bit floats in float32 —
//       reduced[j] = s; submits that shard, in place, to its engine
//   B1  (one chunk later) waits for the engine; done[j] = s
//   B2  waits for every done >= s, copies result[slot] to its output; gathered[j] = s
//
// One host with a lone chunk of at most 64 KiB (Whole): A1, A2 with the whole
// contribution, A3's posted barrier, then every rank reduces the whole chunk (the
// same order, the same bits) straight into its output; reduced, done and gathered =
// s. One barrier per call instead of two, and no result slot.
//
// A(s+1) runs before B(s), so the shared-memory stage of chunk s+1 overlaps the
// network stage of chunk s. Every wait sleeps on a futex with a short timeout and,
// between sleeps, checks the segment's abort word, this process's abort flag, the
// peers' liveness (pidfd) and the deadline: a dead or failed peer fails the call
// within a fraction of a second, a stuck one at the timeout, and nothing hangs.
// A failure poisons the segment for every local rank (abort word); the job is then
// over, as it is after any data-plane failure.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"
#include "reduce/dtype.h"
#include "shm/segment.h"
#include "shm/sync.h"

namespace netreduce {

struct HierarchicalConfig {
  std::vector<int> ranks;  // global rank of each local rank, for error messages
  std::string host;        // this host's name, for error messages
  double timeout_s = 30.0; // a wait with no progress for this long fails
  // Longest busy-wait for a peer before sleeping on its futex, with no more local
  // ranks than CPUs (NETREDUCE_SHM_SPIN_US); 0 = a few hundred pauses only.
  double spin_us = 50.0;
};

class Hierarchical {
 public:
  // `engine` may be null (one host: no network stage). It must outlive this object.
  Hierarchical(std::unique_ptr<shm::Segment> segment, Engine* engine, HierarchicalConfig cfg);
  ~Hierarchical();

  // Waits (up to attach_timeout_s) for every local rank to attach, then starts
  // watching their processes.
  Status Start(double attach_timeout_s);
  // All-reduce `count` elements from src into dst (may be equal) across every rank of
  // every host. Synchronous; call it from one thread at a time.
  Status AllReduce(const void* src, void* dst, size_t count, DType dt, Op op);
  // Fails the running and every later call with `reason` (any thread).
  void Abort(const std::string& reason);
  // Global rank of the local peer whose exit failed a call, or -1.
  int failed_rank() const { return failed_rank_.load(); }
  std::map<std::string, uint64_t> Stats() const;

 private:
  struct Chunk {
    uint32_t serial = 0;
    size_t offset = 0;  // elements
    size_t count = 0;
    std::shared_ptr<Engine::Request> request;
  };
  Status StageA(Chunk& c, const uint8_t* src, DType dt, Op op);
  Status StageB(Chunk& c, uint8_t* dst, DType dt);
  // One host, one small chunk: every rank reduces all of it after one barrier.
  Status Whole(const uint8_t* src, uint8_t* dst, size_t count, DType dt, Op op);
  enum Phase { kPosted, kReduced, kDone, kGathered };
  Status WaitAll(Phase phase, uint32_t target, double timeout_s);
  void Publish(Phase phase, uint32_t serial);
  shm::Counter* Counters(Phase phase) const;
  Status Check();  // Liveness, and records a dead peer as failed_rank()
  // The abort word, this rank's own abort flag, dead peers: the status a wait fails with,
  // recording nothing; *dead is the local rank whose exit it names, or -1.
  Status Liveness(int* dead);
  void Poison(const Status& st);
  void ShardOf(size_t n, uint32_t rank, size_t* lo, size_t* len) const;
  std::string Who(uint32_t local_rank) const;

  std::unique_ptr<shm::Segment> seg_;
  shm::SegmentHeader* hdr_;
  Engine* engine_;
  HierarchicalConfig cfg_;
  uint32_t me_, size_, depth_;
  uint32_t serial_ = 0;  // last chunk serial used
  bool oversubscribed_ = false;  // more local ranks than this process's CPUs (Start)
  // The busy-wait's budget now: up to cfg_.spin_us, halved after each wait the budget
  // could not have covered (the peer was not coming soon), grown back after a wait
  // that ended within it. Written by the calling thread only; read by Stats().
  std::atomic<int64_t> spin_ns_{0};
  bool woke_peer_ = false;  // a Publish woke a sleeping peer since the last wait
  void Adapt(int64_t waited_ns, bool slept);
  int64_t SpinMaxNs() const;
  shm::PeerWatch peers_;
  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;
  std::atomic<int> failed_rank_{-1};
  Status poisoned_;
  std::vector<float> acc_;  // float32 accumulator block for 16-bit floats
  std::atomic<uint64_t> calls_{0}, chunks_{0}, bytes_{0}, shm_ns_{0}, wait_ns_{0}, net_wait_ns_{0}, sleeps_{0},
      wakes_{0}, whole_{0};
};

}  // namespace netreduce
