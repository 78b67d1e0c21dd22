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
// kNapFraction of the window stay in flight, so a link that binds never runs dry.
//
// Never where the link does not bind. What binds may be CPUs instead (this testbed's
// 40 Gbit/s: 4 ranks and the aggregator on 2 cores), and there a nap is not free:
// every rank naps alike, the aggregator's rounds wait for the napping ranks'
// contributions, and a core idles (a first version napped there too: rank CPU 1.05x,
// 4 of 5 pairs higher). Two tests, both measured per message after its first window
// (whose results come as the pipeline fills), before the first nap:
//  - the engine wakes per coalesced receive: a wake-up takes at most kWakeBatches
//    coalesced receives' worth of datagrams on average. An engine the CPU holds back
//    finds several waiting (~2-5 per wake-up at 40 Gbit/s here, ~1 at 1 Gbit/s);
//  - the nap proves itself: the delivery rate over the naps' first kCheckDatagrams
//    stays at least kKeepRate of the rate before, or the message naps no more; after
//    kOffStrikes such messages in a row, nor do the engine's next kRestMessages
//    messages (NapRest). The rate before is a sample of ~12 drains (~6 ms at 1 Gbit/s)
//    and a burst in it reads above the line rate (0.087-0.099 datagrams/us where the
//    testbed's link carries 0.083: the ~85 datagrams over make its shaper's 128 KiB
//    bucket), so a nap that kept the line rate failed the test: ~5 % of messages at
//    1 Gbit/s MTU 1500, and with one verdict resting 16 messages, a benchmark's whole
//    run for that rank (the "3 of 4 ranks nap" runs of issue 33). So the rate before
//    is the slower half of the sample, and one failed message does not start a rest.
// Also, a nap under kMinNapUs is not taken: with the 2 MiB window, results faster than
// ~1.4 Gbit/s per rank (a fast link, where receive batches grow by themselves; the
// looser 1 ms and 2 receives per wake-up still napped ~8 times per 64 MiB at this
// testbed's 40 Gbit/s). Nor for a small message or a message's tail:
// the nap is a fraction of what is still outstanding, so it shrinks below kMinNapUs as
// the last window drains (a 4 KiB all-reduce never naps). The caller ends it before
// the earliest evidence deadline (Engine::Message::NapLimit).
#pragma once

#include <algorithm>
#include <cstdint>

namespace netreduce {
namespace engine_nap {

constexpr int64_t kNapFraction = 8;
constexpr int64_t kMinNapUs = 1500;
constexpr int64_t kMaxNapUs = 8000;  // the most one nap lasts, whatever the estimate
// Datagrams measured before the first nap, and over the first naps.
constexpr uint64_t kMinSampleDatagrams = 512;
constexpr uint64_t kCheckDatagrams = 1024;
// The delivery rate while napping, as a fraction of the rate before, below which the
// naps cost throughput: the link does not bind.
constexpr double kKeepRate = 0.95;
constexpr uint32_t kRestMessages = 16;
constexpr uint32_t kOffStrikes = 2;  // messages in a row whose naps cost rate, before a rest
// Coalesced receives per wake-up, on average, above which the engine is not the one
// waiting: it does not nap.
constexpr double kWakeBatches = 1.5;

// One message's delivery rate and the nap it allows. Engine thread only.
class NapClock {
 public:
  // `skip`: datagrams not measured (the first window); `coalesced`: the datagrams one
  // receive of the transport holds at most (a GRO buffer's worth; 1 without GRO).
  // `allowed`: false while the engine rests from naps that cost throughput.
  NapClock(uint64_t skip, uint64_t coalesced, bool allowed)
      : skip_(skip),
        wake_limit_(kWakeBatches * double(std::max<uint64_t>(coalesced, 1))),
        rest_(!allowed) {}

  // Datagrams one drain took at `now` (results, notices, copies: what the link
  // carried). The clock starts at the drain that completes the skipped ones.
  void Drained(int64_t now, uint64_t datagrams) {
    if (datagrams == 0) return;
    if (skip_ > 0) {
      skip_ -= std::min(skip_, datagrams);
      if (skip_ == 0) since_us_ = now;
      return;
    }
    if (since_us_ < 0) {
      since_us_ = now;
      return;
    }
    datagrams_ += datagrams;
    if (nap_since_us_ < 0) wakes_++;
    if (mid_us_ < 0 && datagrams_ >= kMinSampleDatagrams / 2) {
      mid_us_ = now;
      mid_datagrams_ = datagrams_;
    }
    last_us_ = now;
    if (nap_since_us_ >= 0 && !checked_) {
      nap_datagrams_ += datagrams;
      if (nap_datagrams_ >= kCheckDatagrams) {
        checked_ = true;
        const double during = double(nap_datagrams_) / double(now - nap_since_us_);
        off_ = during < kKeepRate * before_;
      }
    }
  }
  // How long to nap before waiting, with `outstanding` datagrams still to come; 0 = no
  // nap. `caught_up`: the last drain emptied every socket it read (the engine is ahead
  // of the link).
  int64_t NapUs(uint64_t outstanding, bool caught_up) const {
    if (rest_ || off_ || !caught_up || datagrams_ < kMinSampleDatagrams || last_us_ <= since_us_)
      return 0;
    if (nap_since_us_ < 0 && double(datagrams_) > wake_limit_ * double(wakes_)) return 0;
    // outstanding / rate / fraction, the rate datagrams_ / (last_us_ - since_us_)
    const double us = double(outstanding) * double(last_us_ - since_us_) / double(datagrams_) /
                      double(kNapFraction);
    const int64_t nap = std::min<int64_t>(int64_t(us), kMaxNapUs);
    return nap >= kMinNapUs ? nap : 0;
  }
  // A nap is about to be taken: the first one fixes the rate before, and the naps'
  // own measure starts at the last drain.
  void Napping() {
    if (nap_since_us_ >= 0) return;
    before_ = double(datagrams_) / double(last_us_ - since_us_);
    // The slower half of the sample: a burst (a shaper's bucket, a queue let go) can
    // only speed a half up, and a ~6 ms sample that holds one reads far above the link.
    if (mid_us_ > since_us_ && last_us_ > mid_us_) {
      before_ = std::min(double(mid_datagrams_) / double(mid_us_ - since_us_),
                         double(datagrams_ - mid_datagrams_) / double(last_us_ - mid_us_));
    }
    nap_since_us_ = last_us_;
  }
  // Napping lowered the delivery rate in this message: it naps no more.
  bool Off() const { return off_; }
  // The naps' check ran and found the rate kept.
  bool Kept() const { return checked_ && !off_; }

 private:
  uint64_t skip_;
  double wake_limit_;           // datagrams per wake-up above which it does not nap
  uint64_t wakes_ = 0;          // drains that took any, after since_us_ and before a nap
  int64_t since_us_ = -1;       // the drain the measure starts at
  int64_t last_us_ = 0;         // the last drain
  uint64_t datagrams_ = 0;      // taken after since_us_
  double before_ = 0.0;         // datagrams per us before the first nap
  int64_t mid_us_ = -1;         // the drain that completed the sample's first half
  uint64_t mid_datagrams_ = 0;  // taken by then
  int64_t nap_since_us_ = -1;   // the last drain before the first nap
  uint64_t nap_datagrams_ = 0;  // taken since
  bool checked_ = false;
  bool off_ = false;
  bool rest_;
};

// Across an engine's messages: whether the next one may nap. Engine thread only.
class NapRest {
 public:
  // A message starts: false while resting (which uses up one message of the rest).
  bool Start() {
    if (rest_ == 0) return true;
    rest_--;
    return false;
  }
  // A message ended: its naps cost delivery rate (`off`), or kept it (`kept`); neither
  // when it did not nap long enough to tell, which leaves the count as it was.
  // Returns true when this verdict starts a rest.
  bool Judged(bool off, bool kept) {
    if (kept) strikes_ = 0;
    if (!off) return false;
    if (++strikes_ < kOffStrikes) return false;
    rest_ = kRestMessages;
    return true;
  }

 private:
  uint32_t rest_ = 0;     // messages left that do not nap
  uint32_t strikes_ = 0;  // messages in a row whose naps cost rate
};

}  // namespace engine_nap
}  // namespace netreduce
