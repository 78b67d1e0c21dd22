// The engine's tail repair (issue 14): what recovers the chunks that no later result
// can overtake -- a message's last chunk in each lane, which is the whole message for
// most small all-reduces. Without it such a loss waits for the full timeout
// (srtt + 4 rttvar, floor retransmit_ms); engine.cc's loop essay says where the rules
// below hook in. Both apply to the engine's own UDP socket only (not to a verbs
// transport, whose NIC or PSN checks own repeats).
//  - Tail probe (RFC 8985's TLP, in spirit): a lane's tail chunk sent at the head of
//    its lane gets an early deadline of about two smoothed round trips instead of the
//    timeout; what fires is a fast retransmission and the timeout stays as it was.
//  - Tail copy: once the engine has seen real loss (resends not proven needless above
//    kCopyLossThreshold of the packets sent; high enough that the needless ones a
//    loaded host causes, which are not all proven, stay below it), a tail chunk of at most kCopyMaxBytes is
//    sent twice, back to back. The aggregator adds a contribution once, so the copy
//    costs one packet and never a wrong sum; a copy that arrives after its slot
//    completed is answered with the stored result, a second chance for the result's
//    way down too.
#pragma once

#include <cstdint>

namespace netreduce {
namespace engine_repair {

constexpr uint64_t kCopyMinPackets = 200;      // no loss estimate before this many sent
constexpr double kCopyLossThreshold = 0.02;    // resends not proven spurious per packet
constexpr uint32_t kCopyMaxBytes = 9000;       // one jumbo frame: small tails only

// Whether chunk c of a message of nchunks chunks starting at sequence number base is
// the last of its lane (slot (base + c) % window, lane slot % threads).
bool IsLaneTail(int64_t c, int64_t nchunks, uint64_t base, uint32_t window, uint32_t threads);

// The tail probe's delay after a send: 2 srtt, at least `floor_us`, at most `rto_us`
// (before the first sample: rto_us / 2).
int64_t TailProbeUs(double srtt_us, int64_t floor_us, int64_t rto_us);

// Whether a tail chunk of `bytes` goes out twice, from the engine's lifetime counters.
bool CopyTail(uint32_t bytes, uint64_t packets_sent, uint64_t retransmits, uint64_t spurious);

}  // namespace engine_repair
}  // namespace netreduce
