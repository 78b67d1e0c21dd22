// Loss recovery (docs/protocol.md, "Loss, reordering, duplication"). Every rank sends
// in sequence order and an aggregator thread answers in arrival order, so within a
// lane (the slots one data port serves) results come in sequence order:
//  - Overtaken: a result for a later chunk of the lane means an earlier chunk, last
//    sent before it was first sent (the rank's send order), is probably lost. It gets
//    a short reorder deadline (srtt/4, RACK-style) and is resent then if still
//    unanswered (overtaken_resends).
//  - Next expected: when only one chunk of the lane is left outstanding after a
//    result, it gets a deadline of one inter-result gap (its own estimate, gap + 4
//    gapvar, like RFC 6298's): the last chunk of a message, which nothing overtakes,
//    is resent a gap after the previous result instead of a full timeout.
//    Both early resends count as fast_retransmits and leave the timeout as it was.
//  - Timeout: once nothing has completed in a lane for srtt + 4 rttvar of the
//    measured round trip (floor retransmit_ms), the lane's oldest chunk is resent,
//    one per backed-off timeout (doubling up to 1 s; timeout_probes), asking for a
//    held notice: one that answers sends the next oldest's probe at once
//    (probe_notices; message_results.cc, HeldNotice). A timeout is
//    relative to the lane's last progress, as TCP restarts its timer on each ACK:
//    chunks deep in a window wait behind their own predecessors, which a timeout from
//    each chunk's send would take for loss; and a stalled rank costs one packet per
//    doubling rather than a window's worth.
//  - Tail (engine/repair.h): a lane's last chunk of the message, which nothing
//    overtakes (most small all-reduces are one), sent at the head of its lane gets a
//    tail probe of about 2 srtt instead of the timeout; once real loss has been seen,
//    a small one goes out twice, back to back (a copy is a duplicate, never added).
//
// The engine's tail repair (issue 14): what recovers the chunks that no later result
// can overtake -- a message's last chunk in each lane, which is the whole message for
// most small all-reduces. Without it such a loss waits for the full timeout
// (srtt + 4 rttvar, floor retransmit_ms); the rules above say where the two below
// hook in. Both apply to the engine's own UDP socket only (not to a verbs
// transport, whose NIC or PSN checks own repeats).
//  - Tail probe (RFC 8985's TLP, in spirit): a lane's tail chunk sent at the head of
//    its lane gets an early deadline of about two smoothed round trips instead of the
//    timeout; what fires is a fast retransmission and the timeout stays as it was.
//  - Tail copy: once the engine has seen real loss of its own packets (chunks that
//    needed a resend, less those proven needless, above kCopyLossThreshold of the
//    packets sent), a tail chunk of at most kCopyMaxBytes is sent twice, back to back.
//    A lost contribution of any rank stalls the slot for all N, so every rank's probes
//    fire for every rank's loss (and for a descheduled peer): the aggregator marks the
//    results of ranks whose resend arrived while the slot still waited
//    (kExtRepeatSeen), and such a chunk counts as proven needless, like one answered
//    twice; so only a rank's own losses -- what a copy of its own tail repairs -- switch
//    its copies on. Chunks, not resends: a chunk a stalled peer held up for several
//    backed-off resends is one piece of evidence. (Before, resends were counted: 1 %
//    loss read as ~3 % at N = 3, and so did a loaded host's needless resends; copies
//    went on in lossless runs and cost more than they saved; BENCHMARKS.md, issue 14.)
//    The aggregator adds a contribution once, so the copy costs one packet and never a
//    wrong sum; a copy that arrives after its slot completed is answered with the
//    stored result, a second chance for the result's way down too.
#pragma once

#include <cstdint>

namespace netreduce {
namespace engine_repair {

constexpr uint64_t kCopyMinPackets = 200;      // no loss estimate before this many sent
constexpr double kCopyLossThreshold = 0.02;    // unproven repaired chunks per packet
constexpr uint32_t kCopyMaxBytes = 9000;       // one jumbo frame: small tails only

// Whether chunk c of a message of nchunks chunks starting at sequence number base is
// the last of its lane (slot (base + c) % window, lane slot % threads).
bool IsLaneTail(int64_t c, int64_t nchunks, uint64_t base, uint32_t window, uint32_t threads);

// The tail probe's delay after a send: 2 srtt, at least `floor_us`, at most `rto_us`
// (before the first sample: rto_us / 2).
int64_t TailProbeUs(double srtt_us, int64_t floor_us, int64_t rto_us);

// Whether a tail chunk of `bytes` goes out twice, from the engine's lifetime counters:
// packets sent, chunks completed after a resend, and of those the ones proven needless.
bool CopyTail(uint32_t bytes, uint64_t packets_sent, uint64_t repaired, uint64_t proven);

}  // namespace engine_repair
}  // namespace netreduce
