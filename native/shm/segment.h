// One shared-memory segment per host job, for the hierarchical all-reduce.
//
// Lifetime: the segment is a memfd, which has no name (nothing in /dev/shm or on
// any file system), so no exit — SIGKILL included — can leave it behind: the kernel
// frees it when the last mapping and descriptor go. Local rank 0 creates it and
// keeps its descriptor until every local rank has attached; the others open it
// through /proc/<creator pid>/fd/<fd> (their own descriptor of the same memory,
// checked against a random nonce), map it and close the descriptor. The pid, fd
// and nonce travel in the topology exchange at init.
//
// Layout (offsets 64-byte aligned; a cache line per counter so that ranks do not
// write-share lines):
//   SegmentHeader                       one page rounded
//   input[r][d]   r < local_size, d < depth   chunk_bytes each: rank r's copy of its
//                                             contribution to a chunk in ring slot d
//   result[d]     d < depth                  chunk_bytes: the reduced chunk
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace netreduce {
namespace shm {

constexpr uint32_t kMaxLocalRanks = 64;
constexpr uint64_t kSegmentMagic = 0x3130304748535252ull;  // "RRSHG001"

struct alignas(64) Counter {
  std::atomic<uint32_t> v{0};
  // Processes asleep on v's futex (or about to be): the publisher of v makes the
  // futex wake only when there is one, and then knows a peer is on its way back
  // from a sleep (algorithms/hierarchical.cc).
  std::atomic<uint32_t> sleepers{0};
  char pad[56];
};

struct SegmentHeader {
  uint64_t magic;
  uint64_t nonce;
  uint32_t local_size;
  uint32_t depth;
  uint64_t chunk_bytes;
  uint64_t total_bytes;
  alignas(64) std::atomic<uint32_t> attached;
  // 0 while healthy; 1 + the local rank that failed first, which wrote abort_reason
  // before publishing (release) this word. Once set, the segment is unusable.
  alignas(64) std::atomic<uint32_t> abort_word;
  char abort_reason[512];
  int32_t pid[kMaxLocalRanks];
  // Chunk serials each rank has reached in each phase (see algorithms/hierarchical.h).
  Counter posted[kMaxLocalRanks];    // its input for the chunk is in its input slot
  Counter reduced[kMaxLocalRanks];   // it has read every input slot for its shard
  Counter done[kMaxLocalRanks];      // its reduced shard (after the network) is final
  Counter gathered[kMaxLocalRanks];  // it has copied the whole result slot out
};

class Segment {
 public:
  // Local rank 0: a fresh segment for `local_size` ranks, ring of `depth` chunks of
  // `chunk_bytes` each.
  static Status Create(uint32_t local_size, uint64_t chunk_bytes, uint32_t depth,
                       std::unique_ptr<Segment>* out);
  // The others: open local rank 0's (pid, fd), check the nonce, take place
  // `local_rank`.
  static Status Attach(int pid, int fd, uint64_t nonce, uint32_t local_rank,
                       std::unique_ptr<Segment>* out);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Blocks (up to timeout_s) until every local rank has attached, then closes this
  // process's descriptor. Fails early if the segment was aborted.
  Status WaitAttached(double timeout_s);

  int fd() const { return fd_; }
  uint64_t nonce() const { return hdr_->nonce; }
  uint64_t size() const { return size_; }
  uint32_t local_rank() const { return local_rank_; }
  SegmentHeader* header() const { return hdr_; }
  uint8_t* input(uint32_t rank, uint32_t slot) const {
    return base_ + data_offset_ + (uint64_t(rank) * hdr_->depth + slot) * hdr_->chunk_bytes;
  }
  uint8_t* result(uint32_t slot) const {
    return base_ + data_offset_ +
           (uint64_t(hdr_->local_size) * hdr_->depth + slot) * hdr_->chunk_bytes;
  }

 private:
  Segment() = default;
  static uint64_t DataOffset();
  Status Map(uint64_t size);

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_offset_ = 0;
  uint32_t local_rank_ = 0;
  SegmentHeader* hdr_ = nullptr;
};

}  // namespace shm
}  // namespace netreduce
