// What a verbs peer's packets carry beyond the UDP transport's (docs/protocol.md,
// "Verbs peers"). Header-only and free of libibverbs, so the aggregator, which
// answers verbs peers from a plain UDP socket, builds without it.
//
// Worker -> aggregator: the NIC builds BTH, RETH and ImmDt from the work request, so
// BTH.PSN is the NIC's own per-QP sequence (a resend gets a new one) and cannot name
// the chunk's round. The round PSN and the chunk index ride in RETH.VA's low 40 bits
// instead, where the UDP transport puts the element offset:
//   VA = dtype:4 | op:2 | shadow:1 | result:1 | slot:16 | round psn:24 | chunk:16
// The aggregator restores offset = chunk x (P / accumulator width). A verbs message
// therefore has at most 2^16 chunks.
//
// Aggregator -> worker: RDMA WRITE Only with Immediate into the worker's registered
// result ring, VA = ring base + entry x stride, R_Key = the ring's, ImmDt = entry;
// the written bytes are the 32-byte netreduce result header (wire::Encode) followed
// by the result payload, so the worker reads the round's fields from memory.
#pragma once

#include <cstdint>

#include "wire/roce.h"

namespace netreduce {
namespace verbs_wire {

constexpr uint32_t kChunkBits = 16;
constexpr uint64_t kMaxChunks = uint64_t(1) << kChunkBits;
constexpr uint16_t kRoceV2Port = 4791;  // a RoCE NIC sends to this UDP port only
constexpr uint32_t kResultHeaderBytes = wire::kHeaderBytes;  // in the written payload

// The 40-bit "offset" field of a verbs request's VA.
inline uint64_t PackRound(uint32_t psn, uint64_t chunk) {
  return (uint64_t(psn & wire::kPsnMask) << kChunkBits) | (chunk & (kMaxChunks - 1));
}
inline uint32_t RoundPsn(uint64_t field) { return uint32_t(field >> kChunkBits) & wire::kPsnMask; }
inline uint64_t RoundChunk(uint64_t field) { return field & (kMaxChunks - 1); }

// The largest job payload a verbs peer can use on a path of IB MTU `mtu_bytes`: the
// result packet's RDMA payload (result header + data) must fit one packet.
inline uint32_t MaxPayloadForMtu(uint32_t mtu_bytes) {
  return mtu_bytes <= kResultHeaderBytes ? 0 : ((mtu_bytes - kResultHeaderBytes) & ~7u);
}

}  // namespace verbs_wire
}  // namespace netreduce
