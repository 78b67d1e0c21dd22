// When the link binds, the engine naps instead of waking per arriving super-packet.
//
// Results come back at the rate of the slowest link on their path. Where that is well
// below what the engine drains (1 Gbit/s: a 64 KiB GRO super-packet of ~45 results
// every ~0.5 ms, ~0.05 ms of work each), a wait that ends at the first readable byte
// wakes the engine once per super-packet: ~1,040 times per 64 MiB all-reduce at MTU
// 1500 (BENCHMARKS.md, issue 33, "bounds"), each a context switch, a ppoll, a receive
// and a send call for a few dozen results. So, once the engine has caught up (its
// last drain emptied every socket it read) it sleeps 1/kNapFraction of the window's
// time at the measured delivery rate before it waits: the results of that time queue
// in the socket and are taken in one receive batch, and the other (kNapFraction-1)/
// kNapFraction of the window stay in flight, so the link never runs dry.
//
// Never where the link does not bind: a nap under kMinNapUs is not taken. With the
// 2 MiB window that is a delivery rate above ~2 Gbit/s (a 40 Gbit/s link; and this
// testbed's CPU-bound 40 Gbit/s runs at ~4 Gbit/s per rank), where a rank's receive
// batches already grow by themselves. Nor for a small message or a message's tail: the
// nap is a fraction of what is still outstanding, so it shrinks below kMinNapUs as the
// last window drains (a 4 KiB all-reduce never naps), and it ends before the earliest
// timer. The rate is measured per message, from its first drain on, and only once
// kMinSampleDatagrams have come: the first window's results never nap.
#pragma once

#include <algorithm>
#include <cstdint>

namespace netreduce {
namespace engine_nap {

constexpr int64_t kNapFraction = 8;
constexpr int64_t kMinNapUs = 1000;
constexpr int64_t kMaxNapUs = 8000;  // the most one nap lasts, whatever the estimate
constexpr uint64_t kMinSampleDatagrams = 256;

// The delivery rate of one message's results and the nap it allows. Engine thread only.
class NapClock {
 public:
  // Datagrams one drain took at `now` (results, notices, copies: what the link
  // carried). The first drain with any starts the clock; its own are not counted (they
  // arrived before it, over an unknown time).
  void Drained(int64_t now, uint64_t datagrams) {
    if (datagrams == 0) return;
    if (since_us_ < 0) {
      since_us_ = now;
      return;
    }
    datagrams_ += datagrams;
    last_us_ = now;
  }
  // How long to nap before waiting, with `outstanding` datagrams still to come; 0 = no
  // nap. `caught_up`: the last drain emptied every socket it read (the engine is ahead
  // of the link). The caller also ends it before the earliest timer.
  int64_t NapUs(uint64_t outstanding, bool caught_up) const {
    if (!caught_up || datagrams_ < kMinSampleDatagrams || last_us_ <= since_us_) return 0;
    // outstanding / rate / fraction, the rate datagrams_ / (last_us_ - since_us_)
    const double us = double(outstanding) * double(last_us_ - since_us_) / double(datagrams_) /
                      double(kNapFraction);
    const int64_t nap = std::min<int64_t>(int64_t(us), kMaxNapUs);
    return nap >= kMinNapUs ? nap : 0;
  }

 private:
  int64_t since_us_ = -1;  // the first drain that took anything
  int64_t last_us_ = 0;    // the last one
  uint64_t datagrams_ = 0;  // taken after the first
};

}  // namespace engine_nap
}  // namespace netreduce
