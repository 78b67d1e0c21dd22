#include "shm/sync.h"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <ctime>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace netreduce {
namespace shm {

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "futex words must be plain lock-free 32-bit atomics");

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec ts;
  ts.tv_sec = timeout_ms / 1000;
  ts.tv_nsec = long(timeout_ms % 1000) * 1000000L;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

PeerWatch::~PeerWatch() {
  for (int fd : pidfds_) {
    if (fd >= 0) close(fd);
  }
}

void PeerWatch::Open(const std::vector<int>& pids, uint32_t self) {
  pids_ = pids;
  self_ = self;
  pidfds_.assign(pids.size(), -1);
  for (size_t i = 0; i < pids.size(); ++i) {
    if (i == self || pids[i] <= 0) continue;
    pidfds_[i] = int(syscall(SYS_pidfd_open, pids[i], 0));
  }
}

namespace {
// Fallback without pidfds: gone, or a zombie nobody has reaped yet.
bool ProcessGone(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;  // another pid namespace: rely on kill() alone
  int ignored = 0;
  char state = '?';
  // "pid (comm) S ...": comm may hold spaces, so read up to the last ')'.
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  (void)ignored;
  for (size_t i = n; i > 0; --i) {
    if (buf[i - 1] == ')') {
      if (i + 1 < n) state = buf[i + 1];
      break;
    }
  }
  return state == 'Z' || state == 'X';
}
}  // namespace

int PeerWatch::FirstDead() const {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (i == self_ || pids_[i] <= 0) continue;
    if (pidfds_[i] >= 0) {
      pollfd p{pidfds_[i], POLLIN, 0};
      if (poll(&p, 1, 0) > 0) return int(i);
    } else if (ProcessGone(pids_[i])) {
      return int(i);
    }
  }
  return -1;
}

}  // namespace shm
}  // namespace netreduce
