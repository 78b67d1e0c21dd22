// How a finished slot's result reaches a job's ranks: `netreduce-switch --fanout`,
// the binding's `fanout=`, AggregatorConfig::fanout and EngineConfig::fanout — one
// name from the flag to the native field (docs/design.md, "The aggregator").
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace netreduce {

enum class Fanout : uint8_t {
  kUnicast = 0,  // one standard RoCE packet per rank (UC WRITE to each rank's QP)
  kMulticast,    // one packet per slot to the job's IPv4 group; every rank joins it
  // The group's packet, and a unicast copy to each rank whose latest contribution
  // does not say the group reaches it (wire::kExtGroupSeen): a rank that cannot join
  // the group (IPv6, verbs, no multicast route) may leave it out and loses no time.
  kAuto,
  // auto for each job whose ranks all share the daemon's L2 segment, unicast for the
  // others: a job starts without a group, Aggregator::SetJobGroup gives it one
  // (netreduce/switch/fanout.py decides). The daemon's default.
  kSegment,
};

// Whether results may go to a multicast group (multicast, auto, segment).
inline bool HasGroup(Fanout f) { return f != Fanout::kUnicast; }
// Whether the group is verified per rank with unicast copies (auto, segment).
inline bool VerifiesGroup(Fanout f) { return f == Fanout::kAuto || f == Fanout::kSegment; }
// Whether each job's group is given or withheld by the daemon (segment).
inline bool GroupPerJob(Fanout f) { return f == Fanout::kSegment; }

inline const char* FanoutName(Fanout f) {
  switch (f) {
    case Fanout::kUnicast: return "unicast";
    case Fanout::kMulticast: return "multicast";
    case Fanout::kAuto: return "auto";
    case Fanout::kSegment: return "segment";
  }
  return "?";
}

inline Status ParseFanout(const std::string& text, Fanout* out) {
  for (Fanout f : {Fanout::kUnicast, Fanout::kMulticast, Fanout::kAuto, Fanout::kSegment}) {
    if (text == FanoutName(f)) {
      *out = f;
      return Status::Ok();
    }
  }
  return InvalidArgument("fanout must be unicast, multicast, auto or segment, got '" + text + "'");
}

}  // namespace netreduce
