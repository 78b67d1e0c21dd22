#include "algorithms/hierarchical.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace netreduce {
namespace {

using Clock = std::chrono::steady_clock;
// Elements reduced per pass: one block of every input plus the accumulator stays in
// L1/L2 while all L inputs are folded into it.
constexpr size_t kBlock = 4096;
// With no budget for a timed busy-wait (below), pause this many times before sleeping.
constexpr int kSpins = 200;
// With no more local ranks than CPUs, a wait busy-waits for up to its budget
// (HierarchicalConfig::spin_us) before it sleeps on the futex: on a VM a futex wake
// of a peer whose vCPU halted is an IPI and a VM entry, ~27 µs per wake on this
// testbed (BENCHMARKS.md, issue 33, lat2), twice per small all-reduce, while the
// peer is usually a few µs behind. The clock is read every kClockEvery pauses, and
// every kYieldEvery-th read the spin yields, so that a peer the scheduler queued on
// this very CPU runs at once instead of after the budget.
constexpr int kClockEvery = 16;
constexpr int kYieldEvery = 8;
// The budget after waits it could not cover halves (below kSpinFloorNs: none), and
// after a wait that ended within cfg.spin_us it doubles, from kSpinRegrowNs.
constexpr int64_t kSpinFloorNs = 1000;
constexpr int64_t kSpinRegrowNs = 4000;
// With more local ranks than this process has CPUs, the peer waited for is often not
// running at all: then each spin yields the CPU instead (to that peer, if it shares
// this one), a few times before sleeping. 4 ranks on 2 cores, 4 KiB: the algorithm
// alone 0.048-0.057 vs 0.079-0.129 ms, the public API 0.068-0.075 vs 0.091-0.183 ms
// (BENCHMARKS.md, issue 33).
constexpr int kYieldSpins = 20;
// One host (no engine), a lone chunk of at most this many bytes: every rank reduces
// the whole chunk itself (Whole) after one barrier, instead of its shard, a second
// barrier and a copy of the result. Reading L whole inputs costs less than a
// barrier's wake-ups below this (4 KiB on 4 ranks: one barrier of the two is ~half
// the context switches of a call; BENCHMARKS.md, issue 33, tiny4).
constexpr size_t kWholeMaxBytes = 64 * 1024;
constexpr int kSleepMs = 20;     // futex sleep slice between checks
constexpr int64_t kCheckUs = 50000;  // peer liveness every 50 ms of waiting

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

inline int64_t Ns(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// Reduces `len` elements of every local rank's part (part_of(r): its first element),
// ranks in order 0..ranks-1, into `out`, block by block; 16-bit floats through the
// float32 accumulator `wide_acc` (kBlock floats). The same order and kernels wherever
// it runs, so a shard (StageA) and a whole chunk (Whole) get the same bits.
template <typename PartOf>
void ReduceParts(DType dt, Op op, uint32_t ranks, float* wide_acc, uint8_t* out, size_t len,
                 PartOf part_of) {
  const size_t es = ElementSize(dt);
  const bool wide = dt == DType::kF16 || dt == DType::kBF16;
  for (size_t b = 0; b < len; b += kBlock) {
    const size_t m = std::min(kBlock, len - b);
    void* acc = wide ? static_cast<void*>(wide_acc) : static_cast<void*>(out + b * es);
    for (uint32_t r = 0; r < ranks; ++r) Accumulate(dt, op, acc, part_of(r) + b * es, m, r == 0);
    if (wide) {
      Finish(dt, acc, m);  // float32 -> 16 bits, into the block's first half
      std::memcpy(out + b * es, acc, m * es);
    }
  }
}

const char* PhaseName(int p) {
  static const char* kNames[] = {"input", "reduce-scatter", "shard result", "all-gather"};
  return kNames[p];
}

}  // namespace

Hierarchical::Hierarchical(std::unique_ptr<shm::Segment> segment, Engine* engine,
                           HierarchicalConfig cfg)
    : seg_(std::move(segment)), hdr_(seg_->header()), engine_(engine), cfg_(std::move(cfg)),
      me_(seg_->local_rank()), size_(hdr_->local_size), depth_(hdr_->depth) {
  cfg_.ranks.resize(size_, -1);
}

Hierarchical::~Hierarchical() = default;

std::string Hierarchical::Who(uint32_t r) const {
  return "local rank " + std::to_string(r) + " (rank " + std::to_string(cfg_.ranks[r]) +
         ", pid " + std::to_string(hdr_->pid[r]) + ") on host '" + cfg_.host + "'";
}

Status Hierarchical::Start(double attach_timeout_s) {
  NR_RETURN_IF_ERROR(seg_->WaitAttached(attach_timeout_s));
  std::vector<int> pids(size_);
  for (uint32_t r = 0; r < size_; ++r) pids[r] = hdr_->pid[r];
  peers_.Open(pids, me_);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  oversubscribed_ = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 &&
                    uint32_t(CPU_COUNT(&cpus)) < size_;
  spin_ns_.store(oversubscribed_ ? 0 : SpinMaxNs(), std::memory_order_relaxed);
  return Status::Ok();
}

void Hierarchical::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!aborted_) abort_reason_ = reason;
    aborted_ = true;
  }
  if (engine_ != nullptr) engine_->Abort(reason);
  // Wake this process's waits (and, harmlessly, the peers': they re-check and sleep).
  for (int p = kPosted; p <= kGathered; ++p) {
    for (uint32_t r = 0; r < size_; ++r) shm::FutexWakeAll(&Counters(Phase(p))[r].v);
  }
}

shm::Counter* Hierarchical::Counters(Phase phase) const {
  switch (phase) {
    case kPosted: return hdr_->posted;
    case kReduced: return hdr_->reduced;
    case kDone: return hdr_->done;
    default: return hdr_->gathered;
  }
}

void Hierarchical::Publish(Phase phase, uint32_t serial) {
  shm::Counter& c = Counters(phase)[me_];
  // seq_cst store, then the sleepers: against a waiter's increment, then its re-read
  // of v (WaitAll), one of the two sees the other, so no sleeper misses this wake.
  c.v.store(serial, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) != 0) {
    shm::FutexWakeAll(&c.v);
    wakes_.fetch_add(1, std::memory_order_relaxed);
    woke_peer_ = true;
  }
}

void Hierarchical::Poison(const Status& st) {
  uint32_t expected = 0;
  // Only the first failure writes the reason; readers see it after the acquire of
  // a non-zero word, so it is written before the word is published.
  if (hdr_->abort_word.load(std::memory_order_acquire) == 0) {
    std::string text = Who(me_) + ": " + st.message();
    char buf[sizeof(hdr_->abort_reason)];
    std::snprintf(buf, sizeof(buf), "%s", text.c_str());
    // Two ranks failing at once may both write; the text stays a NUL-terminated
    // message of one of them, which is all a reader needs.
    std::memcpy(hdr_->abort_reason, buf, sizeof(buf));
    hdr_->abort_word.compare_exchange_strong(expected, me_ + 1, std::memory_order_acq_rel);
  }
  for (int p = kPosted; p <= kGathered; ++p) {
    for (uint32_t r = 0; r < size_; ++r) shm::FutexWakeAll(&Counters(Phase(p))[r].v);
  }
}

Status Hierarchical::Check() {
  int dead = -1;
  Status st = Liveness(&dead);
  if (dead >= 0) failed_rank_ = cfg_.ranks[dead];
  return st;
}

Status Hierarchical::Liveness(int* dead) {
  *dead = -1;
  if (aborted_) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return Aborted(abort_reason_);
  }
  const uint32_t w = hdr_->abort_word.load(std::memory_order_acquire);
  if (w != 0) {
    return Aborted(std::string("the shared-memory all-reduce failed on ") + hdr_->abort_reason);
  }
  const int exited = peers_.FirstDead();
  if (exited >= 0) {
    // A peer that failed first poisons the segment before it exits: if it did, its
    // reason names the rank that really died (this one may just have left after it).
    if (hdr_->abort_word.load(std::memory_order_acquire) != 0) {
      return Aborted(std::string("the shared-memory all-reduce failed on ") + hdr_->abort_reason);
    }
    *dead = exited;
    return Aborted(Who(uint32_t(exited)) + " exited during a shared-memory all-reduce");
  }
  return Status::Ok();
}

void Hierarchical::Adapt(int64_t waited_ns, bool slept) {
  const int64_t max_ns = SpinMaxNs();
  const int64_t cur = spin_ns_.load(std::memory_order_relaxed);
  int64_t next = cur;
  if (waited_ns > max_ns) {
    next = cur / 2 < kSpinFloorNs ? 0 : cur / 2;  // the peer was not coming soon
  } else if (slept) {
    next = std::min(max_ns, std::max(2 * cur, kSpinRegrowNs));  // it was, but we slept
  }
  if (next != cur) spin_ns_.store(next, std::memory_order_relaxed);
}

int64_t Hierarchical::SpinMaxNs() const {
  return cfg_.spin_us > 0 ? int64_t(cfg_.spin_us * 1000.0) : 0;
}

Status Hierarchical::WaitAll(Phase phase, uint32_t target, double timeout_s) {
  shm::Counter* c = Counters(phase);
  const auto t0 = Clock::now();
  auto last_check = t0;
  // Across hosts a peer's "done" waits for its network stream: not a peer that comes
  // in microseconds, so no timed spin there (and no adapting to it).
  const bool timed = !oversubscribed_ && SpinMaxNs() > 0 && !(phase == kDone && engine_ != nullptr);
  for (uint32_t r = 0; r < size_; ++r) {
    if (r == me_) continue;
    std::atomic<uint32_t>* w = &c[r].v;
    if (shm::Reached(w->load(std::memory_order_acquire), target)) continue;
    const auto tw = timed ? Clock::now() : t0;
    // A peer this rank just woke is a futex wake-up (~27 µs here) away from its next
    // step: sleep on it rather than spin for it (a rank that computes between calls
    // is woken by the other every call; spinning for its wake-up doubles the CPU).
    const int64_t budget = timed && !woke_peer_ ? spin_ns_.load(std::memory_order_relaxed) : 0;
    woke_peer_ = false;
    int spins = 0;
    bool slept = false;
    const int spin_limit = oversubscribed_ ? kYieldSpins : kSpins;
    for (;;) {
      const uint32_t v = w->load(std::memory_order_acquire);
      if (shm::Reached(v, target)) break;
      if (aborted_ || hdr_->abort_word.load(std::memory_order_relaxed) != 0) {
        NR_RETURN_IF_ERROR(Check());
      }
      if (budget > 0 && !slept) {
        ++spins;
        if (spins % kClockEvery != 0) {
          CpuRelax();
          continue;
        }
        if (Ns(tw, Clock::now()) < budget) {
          if (spins % (kClockEvery * kYieldEvery) == 0) sched_yield();
          continue;
        }
      } else if (spins < spin_limit) {
        ++spins;
        if (oversubscribed_) {
          sched_yield();
        } else {
          CpuRelax();
        }
        continue;
      }
      slept = true;
      sleeps_.fetch_add(1, std::memory_order_relaxed);
      std::atomic<uint32_t>& sleepers = c[r].sleepers;
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (w->load(std::memory_order_seq_cst) == v) shm::FutexWait(w, v, kSleepMs);
      sleepers.fetch_sub(1, std::memory_order_seq_cst);
      const auto now = Clock::now();
      if (Ns(last_check, now) >= kCheckUs * 1000) {
        last_check = now;
        // Liveness first, then the word once more: a peer may post what this rank waits
        // for, finish its call and exit (a job's last all-reduce) before this rank, woken
        // but not run on a loaded host, gets here. That is no failure, and the data is
        // in the segment. In this order a post made before the exit is seen. Liveness
        // records nothing: the exit is this call's failure only if the word was not
        // reached, and only then is the rank recorded (failed_rank()).
        int dead = -1;
        const Status st = Liveness(&dead);
        if (shm::Reached(w->load(std::memory_order_seq_cst), target)) break;
        if (dead >= 0) failed_rank_ = cfg_.ranks[dead];
        NR_RETURN_IF_ERROR(st);
        if (Ns(t0, now) >= int64_t(timeout_s * 1e9)) {
          return Timeout("waited " + std::to_string(int(timeout_s)) + " s for " + Who(r) +
                         " to finish its " + PhaseName(phase) + " step of chunk " +
                         std::to_string(target) + " (it is at " + std::to_string(v) + ")");
        }
      }
    }
    if (timed) Adapt(Ns(tw, Clock::now()), slept);
  }
  wait_ns_ += uint64_t(Ns(t0, Clock::now()));
  return Status::Ok();
}

void Hierarchical::ShardOf(size_t n, uint32_t rank, size_t* lo, size_t* len) const {
  const size_t base = n / size_, rem = n % size_;
  *lo = rank * base + std::min<size_t>(rank, rem);
  *len = base + (rank < rem ? 1 : 0);
}

Status Hierarchical::StageA(Chunk& c, const uint8_t* src, DType dt, Op op) {
  const size_t es = ElementSize(dt);
  const uint32_t s = c.serial, slot = s % depth_;
  const uint8_t* mine = src + c.offset * es;
  size_t lo = 0, len = 0;
  ShardOf(c.count, me_, &lo, &len);
  if (s > depth_) NR_RETURN_IF_ERROR(WaitAll(kReduced, s - depth_, cfg_.timeout_s));
  auto t0 = Clock::now();
  uint8_t* in = seg_->input(me_, slot);
  std::memcpy(in, mine, lo * es);  // everything but this rank's own shard
  std::memcpy(in + (lo + len) * es, mine + (lo + len) * es, (c.count - lo - len) * es);
  shm_ns_ += uint64_t(Ns(t0, Clock::now()));
  Publish(kPosted, s);
  NR_RETURN_IF_ERROR(WaitAll(kPosted, s, cfg_.timeout_s));
  if (s > depth_) NR_RETURN_IF_ERROR(WaitAll(kGathered, s - depth_, cfg_.timeout_s));
  t0 = Clock::now();
  uint8_t* out = seg_->result(slot) + lo * es;
  ReduceParts(dt, op, size_, acc_.data(), out, len, [&](uint32_t r) {
    return (r == me_ ? mine : seg_->input(r, slot)) + lo * es;
  });
  shm_ns_ += uint64_t(Ns(t0, Clock::now()));
  Publish(kReduced, s);
  if (engine_ != nullptr && len > 0) c.request = engine_->Submit(out, out, len, dt, op);
  return Status::Ok();
}

Status Hierarchical::StageB(Chunk& c, uint8_t* dst, DType dt) {
  const size_t es = ElementSize(dt);
  const uint32_t s = c.serial, slot = s % depth_;
  if (c.request) {
    const auto t0 = Clock::now();
    Status st = Engine::Wait(*c.request);
    c.request.reset();
    net_wait_ns_ += uint64_t(Ns(t0, Clock::now()));
    NR_RETURN_IF_ERROR(st);
  }
  Publish(kDone, s);
  // The peers' shards wait on their network streams too: allow that time on top.
  NR_RETURN_IF_ERROR(WaitAll(kDone, s, engine_ != nullptr ? 2 * cfg_.timeout_s : cfg_.timeout_s));
  const auto t0 = Clock::now();
  std::memcpy(dst + c.offset * es, seg_->result(slot), c.count * es);
  shm_ns_ += uint64_t(Ns(t0, Clock::now()));
  Publish(kGathered, s);
  return Status::Ok();
}

Status Hierarchical::Whole(const uint8_t* src, uint8_t* dst, size_t count, DType dt, Op op) {
  const size_t es = ElementSize(dt);
  const uint32_t s = ++serial_, slot = s % depth_;
  chunks_++;
  whole_++;
  // The input slot is free once every rank has read chunk s - depth (reduced); the
  // result slot is not used.
  if (s > depth_) NR_RETURN_IF_ERROR(WaitAll(kReduced, s - depth_, cfg_.timeout_s));
  auto t0 = Clock::now();
  uint8_t* in = seg_->input(me_, slot);
  std::memcpy(in, src, count * es);  // all of it: every rank reads every input whole
  shm_ns_ += uint64_t(Ns(t0, Clock::now()));
  Publish(kPosted, s);
  NR_RETURN_IF_ERROR(WaitAll(kPosted, s, cfg_.timeout_s));
  t0 = Clock::now();
  // Every rank gets the sharded path's bits (ReduceParts). This rank's own part is read
  // from its input slot, not src: dst may be src, and block b of dst is written before
  // the later ranks' block b is read.
  ReduceParts(dt, op, size_, acc_.data(), dst, count,
              [&](uint32_t r) { return static_cast<const uint8_t*>(seg_->input(r, slot)); });
  shm_ns_ += uint64_t(Ns(t0, Clock::now()));
  // Done reading the inputs (reduced); done and gathered too, for a sharded chunk
  // s + depth that waits on them before it reuses the result slot.
  Publish(kReduced, s);
  Publish(kDone, s);
  Publish(kGathered, s);
  return Status::Ok();
}

Status Hierarchical::AllReduce(const void* src_v, void* dst_v, size_t count, DType dt, Op op) {
  if (!ValidDType(uint8_t(dt)) || !ValidOp(uint8_t(op))) {
    return InvalidArgument("unknown dtype or op code");
  }
  if (!poisoned_.ok()) {
    return Status(poisoned_.code(), "shared-memory all-reduce unusable after an earlier failure: " +
                                        poisoned_.message());
  }
  {
    Status st = Check();
    if (!st.ok()) {  // poison here too: a peer must not mistake our exit for the cause
      poisoned_ = st;
      Poison(st);
      return st;
    }
  }
  if (count == 0) return Status::Ok();
  const size_t es = ElementSize(dt);
  const size_t per_chunk = hdr_->chunk_bytes / es;
  const auto* src = static_cast<const uint8_t*>(src_v);
  auto* dst = static_cast<uint8_t*>(dst_v);
  if (acc_.size() < kBlock) acc_.resize(kBlock);
  calls_++;
  bytes_ += count * es;

  std::deque<Chunk> pending;  // chunks past stage A, waiting for stage B
  Status st;
  // Every rank takes the same branch: the same count and dtype on every rank.
  const bool whole = engine_ == nullptr && count <= per_chunk && count * es <= kWholeMaxBytes;
  if (whole) st = Whole(src, dst, count, dt, op);
  for (size_t off = whole ? count : 0; off < count && st.ok(); off += per_chunk) {
    Chunk c;
    c.serial = ++serial_;
    c.offset = off;
    c.count = std::min(per_chunk, count - off);
    chunks_++;
    st = StageA(c, src, dt, op);
    pending.push_back(std::move(c));
    // Keep at most depth - 1 chunks past stage A: slot (s % depth) is reused by
    // chunk s + depth only once every rank has gathered chunk s.
    while (st.ok() && pending.size() > depth_ - 1) {
      st = StageB(pending.front(), dst, dt);
      pending.pop_front();
    }
  }
  while (st.ok() && !pending.empty()) {
    st = StageB(pending.front(), dst, dt);
    pending.pop_front();
  }
  if (!st.ok()) {
    poisoned_ = st;
    Poison(st);
    // No engine request may outlive this call: it writes into the segment and reads
    // buffers the caller is about to reuse.
    if (engine_ != nullptr) engine_->Abort(st.message());
    for (Chunk& c : pending) {
      if (c.request) Engine::Wait(*c.request);
    }
  }
  return st;
}

std::map<std::string, uint64_t> Hierarchical::Stats() const {
  return {{"calls", calls_.load()},     {"chunks", chunks_.load()},
          {"bytes", bytes_.load()},     {"busy_ns", shm_ns_.load()},
          {"wait_ns", wait_ns_.load()}, {"net_wait_ns", net_wait_ns_.load()},
          {"oversubscribed", oversubscribed_ ? 1u : 0u},
          {"sleeps", sleeps_.load()},
          {"wakes", wakes_.load()},
          {"whole", whole_.load()},
          {"spin_ns", uint64_t(spin_ns_.load(std::memory_order_relaxed))}};
}

}  // namespace netreduce
