// The netreduce packet: RoCEv2 framing (UDP dst port 4791 by default) carrying an
// InfiniBand BTH + RETH + ImmDt, the payload padded to 4 bytes, and the ICRC.
// Every aggregation field sits where a verbs program on a real RDMA NIC can put it
// (see docs/protocol.md for the byte-level table):
//   BTH.DestQP = (job_index << 12) | rank   -- assigned at admission
//   BTH.PSN    = the worker's packet sequence number mod 2^24 (orders its packets)
//   RETH.VA    = dtype:4 | op:2 | shadow:1 | result:1 | slot:16 | element offset:40
//   RETH.R_Key = the job's 32-bit key;  RETH.DMALen = payload bytes before padding
//   ImmDt      = message id
// A software-only extension (flag kExtJumbo in BTH byte 8's reserved bits) allows
// payloads beyond RoCE's 4 KiB MTU for loopback speed; such packets carry ICRC = 0.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/ip_address.h"

namespace netreduce {
namespace wire {

constexpr uint16_t kDefaultPort = 4791;
constexpr uint8_t kOpcodeUcWriteOnlyImm = 0x2B;  // UC RDMA WRITE Only with Immediate
constexpr uint16_t kDefaultPKey = 0xFFFF;
constexpr size_t kBthBytes = 12;
constexpr size_t kRethBytes = 16;
constexpr size_t kImmBytes = 4;
constexpr size_t kHeaderBytes = kBthBytes + kRethBytes + kImmBytes;  // 32
constexpr size_t kIcrcBytes = 4;
constexpr size_t kRoceMaxPayload = 4096;  // the largest RoCE MTU
// IPv4 (20) + UDP (8) + header (32) + payload + ICRC (4) must fit 65535 bytes;
// rounded down to a multiple of 8 so every dtype's elements fit whole. (IPv6's
// payload length excludes its 40-byte header, so the same datagram fits there too.)
constexpr size_t kMaxPayload = 65464;
constexpr uint8_t kAckReqBit = 0x80;  // BTH byte 8
constexpr uint8_t kExtJumbo = 0x40;   // BTH byte 8, reserved bit: software jumbo payload
// BTH byte 8, reserved bit, on a UDP rank's result only (software extension): the
// round had this rank's contribution before a repeat of it (resend or tail copy)
// arrived, so that repeat was needless (docs/protocol.md, "Repeat seen").
constexpr uint8_t kExtRepeatSeen = 0x20;
// BTH byte 8, reserved bit, on a header-only answer to a contribution that asked for
// one (kAckReqBit, BTH's AckReq): the round holds this rank's contribution and waits
// for other ranks' (docs/protocol.md, "Held notices"). Software extension, UDP ranks.
constexpr uint8_t kExtHeld = 0x10;
// BTH byte 8, reserved bit (software extension, any packet): the sender's UDP checksum
// covers this datagram (netreduce never sends UDP checksum 0; a RoCE NIC does, and
// leaves the bit clear). A receiver whose kernel socket delivered it knows that checksum
// was verified, and under NETREDUCE_ICRC_CHECK=auto need not recompute the ICRC
// (IcrcCheckNeeded; docs/protocol.md, "ICRC and the UDP checksum").
constexpr uint8_t kExtUdpChecksum = 0x08;
// BTH byte 8, reserved bit, on a contribution only (software extension): this rank
// received one of its job's multicast results within the last second
// (engine/group_watch.h). Under --fanout auto the aggregator sends a rank whose latest
// contribution lacks it a unicast copy of each result beside the group's
// (docs/protocol.md, "Multicast fan-out, auto").
constexpr uint8_t kExtGroupSeen = 0x04;

constexpr uint32_t kRankBits = 12;
constexpr uint32_t kMaxRanks = 1u << kRankBits;  // per job
constexpr uint32_t kMaxJobs = 1u << (24 - kRankBits);
constexpr uint32_t kPsnMask = 0xFFFFFF;
constexpr uint64_t kMaxOffset = (uint64_t(1) << 40) - 1;  // elements

// Owner delivery (reduce-scatter, docs/protocol.md): ImmDt's top bit set means the
// slot's result goes to one rank only, named by the next 12 bits; the others get a
// header-only completion notice (DMA length 0). The low 19 bits count messages.
constexpr uint32_t kOwnerFlag = 0x80000000u;
constexpr uint32_t kOwnerShift = 19;
constexpr uint32_t kMsgCounterMask = (1u << kOwnerShift) - 1;
inline bool OwnerDelivery(uint32_t msg_id) { return (msg_id & kOwnerFlag) != 0; }
inline uint32_t MsgOwner(uint32_t msg_id) { return (msg_id >> kOwnerShift) & 0xFFF; }
inline uint32_t MakeOwnerMsgId(uint32_t counter, uint32_t owner) {
  return kOwnerFlag | (owner << kOwnerShift) | (counter & kMsgCounterMask);
}

inline uint32_t MakeQpn(uint32_t job_index, uint32_t rank) {
  return (job_index << kRankBits) | rank;
}
// The rank field value that addresses every rank of a job at once: a result sent
// by multicast (software extension, aggregator --fanout multicast). IB multicast
// uses the all-ones QPN the same way.
constexpr uint32_t kGroupRank = kMaxRanks - 1;
inline uint32_t MakeGroupQpn(uint32_t job_index) { return MakeQpn(job_index, kGroupRank); }
inline uint32_t QpnJob(uint32_t qpn) { return qpn >> kRankBits; }
inline uint32_t QpnRank(uint32_t qpn) { return qpn & (kMaxRanks - 1); }

// A decoded header, host byte order.
struct Header {
  uint8_t opcode = kOpcodeUcWriteOnlyImm;
  uint8_t pad = 0;        // BTH PadCnt: bytes after the payload to reach 4-byte alignment
  bool jumbo = false;     // kExtJumbo set: payload may exceed 4 KiB, ICRC not computed
  uint32_t dest_qp = 0;   // 24 bits
  uint32_t psn = 0;       // 24 bits
  uint8_t dtype = 0;      // 4 bits, reduce/dtype.h codes
  uint8_t op = 0;         // 2 bits, reduce/dtype.h codes
  uint8_t shadow = 0;     // 1 bit
  bool result = false;    // set on the aggregator's answers
  bool repeat_seen = false;  // kExtRepeatSeen, results only
  bool ack_req = false;   // kAckReqBit, contributions only: answer with a held notice
  bool held = false;      // kExtHeld, results only: a held notice, not a result
  bool udp_checksum = false;  // kExtUdpChecksum: the sender set the UDP checksum
  bool group_seen = false;    // kExtGroupSeen, contributions only
  uint16_t slot = 0;
  uint64_t offset = 0;    // element offset of this payload inside the message, 40 bits
  uint32_t key = 0;       // job key (R_Key)
  uint32_t length = 0;    // payload bytes, unpadded (DMA Length)
  uint32_t msg_id = 0;    // immediate data
};

enum class DecodeError : int {
  kOk = 0,
  kTruncated,   // shorter than header + ICRC
  kBadOpcode,   // not UC RDMA WRITE Only with Immediate
  kBadLength,   // DMA length / pad / datagram size disagree, or payload too large
};

// Writes the 32-byte header.
void Encode(const Header& h, uint8_t* out);
// Parses and validates the framing of a whole datagram of `len` bytes.
DecodeError Decode(const uint8_t* pkt, size_t len, Header* h);

inline size_t PaddedLength(size_t payload) { return (payload + 3) & ~size_t(3); }
inline size_t DatagramBytes(size_t payload) {
  return kHeaderBytes + PaddedLength(payload) + kIcrcBytes;
}

// The ICRC as RoCEv2 defines it: CRC-32 (IEEE 802.3) over 8 bytes of 0xFF (the
// masked LRH), the IP header with its variant fields set to all ones, the UDP header
// with its checksum set to all ones, the BTH with its byte 4 (FECN, BECN, resv6) set
// to 0xFF, the rest of the headers, the payload and the pad. Variant fields:
//  - IPv4 (20 bytes): TOS, TTL and header checksum. IPv4 ID is 0 and DF is set:
//    netreduce's sockets are unconnected with IP_PMTUDISC_DO, for which Linux sends
//    ID 0 (segment k of a GSO send: ID k, IcrcIpIdDelta below).
//  - IPv6 (40 bytes): traffic class, flow label and hop limit, so the first four
//    bytes are 6F FF FF FF; payload length = UDP length, next header 17.
// The family is the destination's: an IPv4(-mapped) address means an IPv4 packet.
// Ports in network byte order. Returned as the value to store little-endian.
uint32_t ComputeIcrc(const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
                     uint16_t dst_port_be, const uint8_t* header, const uint8_t* payload,
                     size_t payload_len, size_t pad);

// One result to N ranks: the payload is the same in every packet, only the headers
// (addresses, ports, QPN) differ. PayloadCrc is the CRC-32 of the payload and its
// pad, computed once; ComputeIcrcWith then costs one CRC of the ~90-byte prefix and a
// table lookup per packet (CRC(A || B) = shift(CRC(A), |B|) ^ CRC(B)) instead of a
// pass over the payload. Same value as ComputeIcrc.
uint32_t PayloadCrc(const uint8_t* payload, size_t payload_len, size_t pad);
uint32_t ComputeIcrcWith(const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
                         uint16_t dst_port_be, const uint8_t* header, size_t payload_len,
                         size_t pad, uint32_t payload_crc);

// The ICRC in two steps, for a sender whose packets share their addresses, ports and
// datagram length (an engine's full chunks to one data port): IcrcSeed is the CRC of
// what precedes the header (the masked LRH, IP and UDP headers), computed once;
// IcrcFromSeed carries it on over the header (byte 4 masked), the payload and its pad.
// The same value as ComputeIcrc, without building and hashing that prefix per packet.
uint32_t IcrcSeed(const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
                  uint16_t dst_port_be, size_t payload_len, size_t pad);
uint32_t IcrcFromSeed(uint32_t seed, const uint8_t* header, const uint8_t* payload,
                      size_t payload_len, size_t pad);

// Writes the trailer of a packet with header `h`: the pad's zero bytes, then the ICRC
// (0 on jumbo packets); `trailer` holds at least 8 bytes. Ports in network order.
// `payload_crc`, when given, is PayloadCrc of this payload (a fan-out's shared part).
void WriteTrailer(const Header& h, const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
                  uint16_t dst_port_be, const uint8_t* header, const uint8_t* payload,
                  uint8_t* trailer, const uint32_t* payload_crc = nullptr);
// WriteTrailer from IcrcSeed's value for this packet's addresses, ports and length.
void WriteTrailerFromSeed(const Header& h, uint32_t seed, const uint8_t* header,
                          const uint8_t* payload, uint8_t* trailer);
// Whether a received datagram `pkt` (already decoded into `h`) carries the ICRC its
// addresses and ports call for; jumbo packets carry none and always pass. A socket
// does not see the IPv4 ID, so an IPv4 ICRC passes for any ID a GSO send can give
// (0 .. kMaxGsoSegments - 1, see IcrcIpIdDelta).
bool IcrcValid(const Header& h, const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
               uint16_t dst_port_be, const uint8_t* pkt);

// Whether a received packet's ICRC must be computed. Not for a jumbo packet (it has
// none), nor, when `trust_udp_checksum` (NETREDUCE_ICRC_CHECK=auto), for one that a
// kernel UDP socket delivered (`kernel_checked`: its kernel dropped it had its UDP
// checksum been wrong) whose sender set that checksum (kExtUdpChecksum): the same
// end-to-end check TCP relies on, with Ethernet's CRC on every link. A standard RoCE
// sender (checksum 0, bit clear) and every packet AF_XDP delivers are still checked.
inline bool IcrcCheckNeeded(const Header& h, bool kernel_checked, bool trust_udp_checksum) {
  return !h.jumbo && !(trust_udp_checksum && kernel_checked && h.udp_checksum);
}

// UDP GSO (transport/udp/): one send of up to kMaxGsoSegments datagrams, which the
// kernel (or the NIC) cuts apart, numbering their IPv4 IDs 0, 1, 2, ... (a DF datagram
// of an unconnected socket starts at ID 0), and the ICRC covers that ID. CRC-32 is
// linear, so the ICRC for ID k is the one for ID 0 XOR a value that depends only on
// k and on how many bytes follow the ID: IcrcIpIdDelta, for a datagram (UDP payload:
// header, padded payload, ICRC) of `datagram_bytes`. IPv6 has no ID.
constexpr uint32_t kMaxGsoSegments = 64;
uint32_t IcrcIpIdDelta(size_t datagram_bytes, uint32_t id);
// The same for every ID 0..kMaxGsoSegments-1 of one datagram length: a table the
// calling thread may read until its next IcrcIpIdDelta(s) call for another length.
const uint32_t* IcrcIpIdDeltas(size_t datagram_bytes);

// The same over IPv4 addresses in network byte order.
inline uint32_t ComputeIcrc(uint32_t src_ip_be, uint32_t dst_ip_be, uint16_t src_port_be,
                            uint16_t dst_port_be, const uint8_t* header, const uint8_t* payload,
                            size_t payload_len, size_t pad) {
  return ComputeIcrc(IpAddr::V4(src_ip_be), IpAddr::V4(dst_ip_be), src_port_be, dst_port_be,
                     header, payload, payload_len, pad);
}
inline void WriteTrailer(const Header& h, uint32_t src_ip_be, uint32_t dst_ip_be,
                         uint16_t src_port_be, uint16_t dst_port_be, const uint8_t* header,
                         const uint8_t* payload, uint8_t* trailer) {
  WriteTrailer(h, IpAddr::V4(src_ip_be), IpAddr::V4(dst_ip_be), src_port_be, dst_port_be, header,
               payload, trailer);
}
inline bool IcrcValid(const Header& h, uint32_t src_ip_be, uint32_t dst_ip_be,
                      uint16_t src_port_be, uint16_t dst_port_be, const uint8_t* pkt) {
  return IcrcValid(h, IpAddr::V4(src_ip_be), IpAddr::V4(dst_ip_be), src_port_be, dst_port_be, pkt);
}

}  // namespace wire
}  // namespace netreduce
