// The cost of a futex wake between two processes, the way the shared-memory all-reduce
// waits (native/algorithms/hierarchical.cc): a parent and a child pass a counter back and
// forth through a shared page; each side waits for the other's value by
//   spin = 0      a futex sleep straight away,
//   spin = -1     200 pauses, then the futex (the wait before lat2's change),
//   spin = NS     pauses by the clock for up to NS ns, then the futex.
// "pin" puts parent and child on CPUs 0 and 1 (each vCPU halts while its side sleeps).
// Prints per side: µs per round trip, process CPU µs per round trip, futex sleeps per
// round trip.
//
//   gcc -O2 -o /tmp/futex_pingpong benchmarks/futex_pingpong.c
//   /tmp/futex_pingpong SPIN ROUND_TRIPS [pin]
#define _GNU_SOURCE
#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long spin_ns;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void wait_for(_Atomic uint32_t* w, uint32_t target, long* sleeps) {
  uint64_t t0 = 0;
  for (;;) {
    uint32_t v = atomic_load(w);
    if (v >= target) return;
    if (spin_ns < 0) {
      for (int i = 0; i < 200; i++) {
        _mm_pause();
        if (atomic_load(w) >= target) return;
      }
    } else if (spin_ns > 0) {
      if (!t0) t0 = now_ns();
      if (now_ns() - t0 < (uint64_t)spin_ns) {
        _mm_pause();
        continue;
      }
    }
    (*sleeps)++;
    syscall(SYS_futex, w, FUTEX_WAIT, v, NULL, NULL, 0);
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s SPIN ROUND_TRIPS [pin]\n", argv[0]);
    return 2;
  }
  spin_ns = atol(argv[1]);
  const uint32_t iters = (uint32_t)atol(argv[2]);
  _Atomic uint32_t* w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (w == MAP_FAILED) return 1;
  pid_t child = fork();
  const int me = child == 0;
  if (argc > 3) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(me, &s);
    sched_setaffinity(0, sizeof s, &s);
  }
  _Atomic uint32_t* mine = &w[me ? 16 : 0];  // separate cache lines
  _Atomic uint32_t* peer = &w[me ? 0 : 16];
  long sleeps = 0;
  struct timespec c0, c1;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  const uint64_t t0 = now_ns();
  for (uint32_t i = 1; i <= iters; i++) {
    if (me) wait_for(peer, i, &sleeps);
    atomic_store(mine, i);
    syscall(SYS_futex, mine, FUTEX_WAKE, 1, NULL, NULL, 0);
    if (!me) wait_for(peer, i, &sleeps);
  }
  const uint64_t t1 = now_ns();
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  const double cpu_us = (double)(c1.tv_sec - c0.tv_sec) * 1e6 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e3;
  printf("{\"side\": \"%s\", \"spin\": %ld, \"pinned\": %d, \"rtt_us\": %.2f, \"cpu_us_per_rt\": %.2f, "
         "\"sleeps_per_rt\": %.2f}\n",
         me ? "child" : "parent", spin_ns, argc > 3, (double)(t1 - t0) / 1e3 / iters, cpu_us / iters,
         (double)sleeps / iters);
  if (child > 0) wait(NULL);
  return 0;
}
