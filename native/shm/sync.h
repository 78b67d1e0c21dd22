// Cross-process synchronisation for the shared-memory stage: futex waits on 32-bit
// counters that live in a shared mapping, and a watch on the peer processes so that
// a wait never outlives the peer it waits for.
//
// Counters only ever grow (a chunk serial number), so "peer i has reached serial s"
// is a comparison; it is made modulo 2^32 so that a long job may wrap them.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace netreduce {
namespace shm {

// a >= b for serial numbers that may wrap.
inline bool Reached(uint32_t a, uint32_t b) { return int32_t(a - b) >= 0; }

// Sleeps while *word == expected, for at most timeout_ms (spurious wake-ups are
// fine: callers re-check). Shared (not FUTEX_PRIVATE): the word is in a mapping
// several processes share.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
// Wakes every process sleeping on *word.
void FutexWakeAll(std::atomic<uint32_t>* word);

// Watches the other local ranks' processes: pidfds where the kernel has them (they
// become readable when the process exits, zombies included, and cannot be fooled
// by pid reuse); kill(pid, 0) plus /proc/PID/stat otherwise.
class PeerWatch {
 public:
  PeerWatch() = default;
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // pids[i] of local rank i; `self` is not watched.
  void Open(const std::vector<int>& pids, uint32_t self);
  // The local rank of a peer that has exited, or -1.
  int FirstDead() const;

 private:
  std::vector<int> pids_;
  std::vector<int> pidfds_;  // -1 = no pidfd (self, or the fallback)
  uint32_t self_ = 0;
};

}  // namespace shm
}  // namespace netreduce
