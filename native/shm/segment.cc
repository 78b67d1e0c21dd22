#include "shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <random>

#include "shm/sync.h"

namespace netreduce {
namespace shm {

namespace {
std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

int MemfdCreate(const char* name) {
#ifdef SYS_memfd_create
  return int(syscall(SYS_memfd_create, name, 1u /* MFD_CLOEXEC */));
#else
  errno = ENOSYS;
  return -1;
#endif
}
}  // namespace

uint64_t Segment::DataOffset() { return (sizeof(SegmentHeader) + 4095) / 4096 * 4096; }

Segment::~Segment() {
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
}

Status Segment::Map(uint64_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) return IoError(Errno("mmap of the shared-memory segment failed"));
  base_ = static_cast<uint8_t*>(p);
  size_ = size;
  data_offset_ = DataOffset();
  hdr_ = reinterpret_cast<SegmentHeader*>(base_);
  // A process forked later (a data-loader worker) must not inherit the mapping: it
  // would keep the memory alive and could scribble on it.
  madvise(base_, size_, MADV_DONTFORK);
  return Status::Ok();
}

Status Segment::Create(uint32_t local_size, uint64_t chunk_bytes, uint32_t depth,
                       std::unique_ptr<Segment>* out) {
  if (local_size == 0 || local_size > kMaxLocalRanks) {
    return InvalidArgument("local size " + std::to_string(local_size) + " outside 1.." +
                           std::to_string(kMaxLocalRanks));
  }
  if (depth == 0 || chunk_bytes < 64 || chunk_bytes % 64 != 0) {
    return InvalidArgument("shared-memory ring of " + std::to_string(depth) + " chunks of " +
                           std::to_string(chunk_bytes) + " bytes (need >= 1 chunk, a multiple of 64 B)");
  }
  std::unique_ptr<Segment> s(new Segment());
  s->fd_ = MemfdCreate("netreduce-hierarchical");
  if (s->fd_ < 0) return IoError(Errno("memfd_create failed"));
  const uint64_t size = DataOffset() + uint64_t(local_size + 1) * depth * chunk_bytes;
  if (ftruncate(s->fd_, off_t(size)) != 0) {
    return IoError(Errno("sizing the shared-memory segment to " + std::to_string(size) + " bytes failed"));
  }
  NR_RETURN_IF_ERROR(s->Map(size));
  SegmentHeader* h = new (s->base_) SegmentHeader();
  h->nonce = std::random_device{}() | (uint64_t(std::random_device{}()) << 32);
  h->nonce &= 0x7fffffffffffffffull;  // travels as a non-negative int64
  h->local_size = local_size;
  h->depth = depth;
  h->chunk_bytes = chunk_bytes;
  h->total_bytes = size;
  h->pid[0] = int32_t(getpid());
  h->attached.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kSegmentMagic;
  s->local_rank_ = 0;
  *out = std::move(s);
  return Status::Ok();
}

Status Segment::Attach(int pid, int fd, uint64_t nonce, uint32_t local_rank,
                       std::unique_ptr<Segment>* out) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  std::unique_ptr<Segment> s(new Segment());
  s->fd_ = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (s->fd_ < 0) {
    return IoError(Errno("cannot open local rank 0's shared-memory segment " + path +
                         " (did it exit? do both processes share a pid namespace and user?)"));
  }
  struct stat st;
  if (fstat(s->fd_, &st) != 0) return IoError(Errno("fstat " + path));
  if (uint64_t(st.st_size) < DataOffset()) {
    return InvalidArgument(path + " is not a netreduce shared-memory segment (too small)");
  }
  NR_RETURN_IF_ERROR(s->Map(uint64_t(st.st_size)));
  SegmentHeader* h = s->hdr_;
  if (h->magic != kSegmentMagic || h->nonce != nonce || h->total_bytes != s->size_) {
    return InvalidArgument(path + " is not this job's shared-memory segment (nonce mismatch)");
  }
  if (local_rank == 0 || local_rank >= h->local_size) {
    return InvalidArgument("local rank " + std::to_string(local_rank) + " cannot attach to a segment for " +
                           std::to_string(h->local_size) + " local ranks");
  }
  h->pid[local_rank] = int32_t(getpid());
  s->local_rank_ = local_rank;
  h->attached.fetch_add(1, std::memory_order_acq_rel);
  FutexWakeAll(&h->attached);
  *out = std::move(s);
  return Status::Ok();
}

Status Segment::WaitAttached(double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::microseconds(int64_t(timeout_s * 1e6));
  for (;;) {
    const uint32_t n = hdr_->attached.load(std::memory_order_acquire);
    if (hdr_->abort_word.load(std::memory_order_acquire) != 0) {
      return Aborted(std::string("shared-memory segment aborted while attaching: ") + hdr_->abort_reason);
    }
    if (n >= hdr_->local_size) break;
    if (Clock::now() >= deadline) {
      std::string missing;
      for (uint32_t r = 0; r < hdr_->local_size; ++r) {
        if (hdr_->pid[r] == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      return Timeout("only " + std::to_string(n) + " of " + std::to_string(hdr_->local_size) +
                     " local ranks attached to the shared-memory segment within " +
                     std::to_string(timeout_s) + " s (missing local ranks " + missing + ")");
    }
    FutexWait(&hdr_->attached, n, 50);
  }
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
  return Status::Ok();
}

}  // namespace shm
}  // namespace netreduce
