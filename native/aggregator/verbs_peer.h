// The aggregator's side of verbs workers (docs/protocol.md, "Verbs peers"): ranks
// whose host speaks through an RDMA NIC's UC queue pair rather than a UDP socket.
// Their requests differ in two fields (the round PSN rides in RETH.VA, the NIC's
// ICRC covers an IPv4 ID that a UDP socket cannot see), and their results must be
// what the NIC accepts: RDMA WRITE Only with Immediate to the worker's QPN, a PSN
// sequence of the aggregator's own per QP, RETH naming the worker's registered
// result ring, and a valid ICRC. Built from plain UDP; no libibverbs needed here.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "transport/transport.h"
#include "wire/roce.h"

namespace netreduce {

// One rank's queue pair, as its verbs_connect announced it.
struct VerbsPeerInfo {
  uint32_t ip = 0;        // network order: where results go (UDP port 4791)
  uint32_t qpn = 0;       // the worker's QP (BTH.DestQP of results)
  uint64_t ring_va = 0;   // result ring: VA, R_Key, entries of `stride` bytes
  uint32_t rkey = 0;
  uint32_t entries = 0;
  uint32_t stride = 0;
  bool rc = false;          // an RC queue pair: the aggregator is its responder and requester
  uint32_t worker_psn = 0;  // RC: the first PSN the worker's QP sends
};

// RC state of one peer (verbs_rc.cc): the responder's expected PSN and MSN for the
// worker's requests, and the results sent but not yet acknowledged (go-back-N).
struct VerbsRcState {
  uint32_t expect_psn = 0;
  uint32_t msn = 0;
  bool nak_sent = false;  // one sequence NAK per gap, as a responder must
  bool ack_due = false;   // requests taken in this receive batch await one coalesced ACK
  uint32_t ack_psn = 0;   // the last of them
  struct Unacked {
    uint32_t psn;
    int64_t sent_us;
    std::vector<uint8_t> pkt;  // the whole UDP payload, as first sent
  };
  std::deque<Unacked> unacked;
  uint64_t retransmits = 0;
};

struct VerbsPeer {
  std::atomic<bool> active{false};  // set (release) once the fields below are written
  VerbsPeerInfo info;
  // Only the one data thread that serves a verbs job touches these (--threads 1).
  uint32_t next_psn = 0;
  uint32_t next_entry = 0;
  VerbsRcState rc;
};

// Per job, by rank. Ranks attach from control threads while data threads read.
class VerbsPeerTable {
 public:
  explicit VerbsPeerTable(uint32_t size) : peers_(new VerbsPeer[size]), size_(size) {}
  bool Active(uint32_t rank) const {
    return rank < size_ && peers_[rank].active.load(std::memory_order_acquire);
  }
  VerbsPeer& peer(uint32_t rank) { return peers_[rank]; }
  uint32_t size() const { return size_; }

 private:
  std::unique_ptr<VerbsPeer[]> peers_;
  uint32_t size_;
};

// A verbs request's header as the slot state machine expects it: the round PSN and
// the element offset from RETH.VA's low 40 bits (verbs_wire.h). False: the chunk
// index does not fit a payload of `payload_bytes`.
bool TranslateVerbsRequest(wire::Header* h, uint32_t payload_bytes);

// Bytes of a verbs result's headers: BTH + RETH + ImmDt, then the 32-byte netreduce
// result header that starts the RDMA payload.
constexpr size_t kVerbsResultHeadBytes = wire::kHeaderBytes + wire::kHeaderBytes;

// Builds the result `round` (already the result header for this rank) to `peer`:
// writes kVerbsResultHeadBytes into `head` and pad + ICRC into `trailer` (8 bytes),
// advancing the peer's PSN and ring entry. Returns the trailer's length.
// RC peers get RC RDMA WRITE Only with Immediate with AckReq set.
size_t BuildVerbsResult(VerbsPeer& peer, const wire::Header& round, uint32_t src_ip_be,
                        uint16_t src_port_be, const uint8_t* payload, uint8_t* head,
                        uint8_t* trailer);

constexpr uint8_t kOpcodeRcWriteOnlyImm = 0x0B;
constexpr uint8_t kOpcodeRcAck = 0x11;
inline bool VerbsRcOpcode(uint8_t op) { return op == kOpcodeRcWriteOnlyImm || op == kOpcodeRcAck; }
// Keeps a copy of RC result `p` (its iovs) until the worker's NIC acknowledges it.
void RememberUnacked(VerbsPeer& peer, const OutPacket& p);
// RoCEv2's ICRC over `head` (BTH first, head_len bytes) + payload + pad zeros.
uint32_t VerbsIcrc(uint32_t src_ip_be, uint32_t dst_ip_be, uint16_t src_port_be,
                   uint16_t dst_port_be, const uint8_t* head, size_t head_len,
                   const uint8_t* payload, size_t len, size_t pad);

}  // namespace netreduce
