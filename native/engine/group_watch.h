// Whether the job's multicast group reaches this rank (--fanout auto; docs/protocol.md,
// "Multicast fan-out, auto"). The engine's contributions say so with
// wire::kExtGroupSeen, and the aggregator sends a unicast copy of each result to a
// rank whose latest contribution does not.
//  - Heard: a datagram came through the group socket.
//  - Fresh: one came within the last second (an idle engine forgets: after a pause the
//    first window of the next message gets copies until the group is heard again).
//  - Gone: a result that a chunk was waiting for came by unicast while the group has
//    been silent for a whole timeout (not an owner-delivered one: those always come by
//    unicast, docs/protocol.md "Reduce-scatter"). The aggregator sends no copies to a
//    rank that says the group reaches it, so that result answered a resend: the group
//    does not reach this rank (any more), and the bit clears at once, not after a second.
#pragma once

#include <cstdint>

namespace netreduce {

class GroupWatch {
 public:
  static constexpr int64_t kFreshUs = 1000000;
  void Heard(int64_t now_us) { last_us_ = now_us; }
  bool Fresh(int64_t now_us) const { return last_us_ >= 0 && now_us - last_us_ < kFreshUs; }
  void UnicastResult(int64_t now_us, int64_t rto_us) {
    if (last_us_ >= 0 && now_us - last_us_ > rto_us) last_us_ = -1;
  }

 private:
  int64_t last_us_ = -1;  // when a group datagram last came; -1 = not since Gone
};

}  // namespace netreduce
