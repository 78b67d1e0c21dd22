// Verbs peers: request translation, result packets, and the Aggregator's two hooks
// for them (attach at verbs_connect, queue a result). See verbs_peer.h.
#include "aggregator/verbs_peer.h"

#include <arpa/inet.h>
#include <zlib.h>

#include <cstring>
#include <random>

#include "aggregator/aggregator.h"
#include "reduce/dtype.h"
#include "transport/verbs/verbs_wire.h"

namespace netreduce {
namespace {

inline void Put16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v >> 8); p[1] = uint8_t(v); }
inline void Put24(uint8_t* p, uint32_t v) { p[0] = uint8_t(v >> 16); p[1] = uint8_t(v >> 8); p[2] = uint8_t(v); }
inline void Put32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24); p[1] = uint8_t(v >> 16); p[2] = uint8_t(v >> 8); p[3] = uint8_t(v);
}
inline void Put64(uint8_t* p, uint64_t v) { Put32(p, uint32_t(v >> 32)); Put32(p + 4, uint32_t(v)); }

// RoCEv2's ICRC over a packet whose headers are `head` (BTH first) and whose payload
// is `payload` + `pad` zero bytes: the same rule as wire::ComputeIcrc (masked LRH,
// IPv4 with TOS/TTL/checksum masked and ID 0 as this host's DF datagrams carry, UDP
// with its checksum masked, BTH byte 4 masked), for headers longer than 32 bytes.
}  // namespace

uint32_t VerbsIcrc(uint32_t src_ip_be, uint32_t dst_ip_be, uint16_t src_port_be, uint16_t dst_port_be,
                   const uint8_t* head, size_t head_len, const uint8_t* payload, size_t len,
                   size_t pad) {
  uint8_t pseudo[8 + 20 + 8 + wire::kBthBytes];
  std::memset(pseudo, 0xFF, 8);
  uint8_t* ip = pseudo + 8;
  const size_t udp_len = 8 + head_len + len + pad + wire::kIcrcBytes;
  ip[0] = 0x45;
  ip[1] = 0xFF;
  Put16(ip + 2, uint16_t(20 + udp_len));
  Put16(ip + 4, 0);
  Put16(ip + 6, 0x4000);
  ip[8] = 0xFF;
  ip[9] = 17;
  Put16(ip + 10, 0xFFFF);
  std::memcpy(ip + 12, &src_ip_be, 4);
  std::memcpy(ip + 16, &dst_ip_be, 4);
  uint8_t* udp = ip + 20;
  std::memcpy(udp, &src_port_be, 2);
  std::memcpy(udp + 2, &dst_port_be, 2);
  Put16(udp + 4, uint16_t(udp_len));
  Put16(udp + 6, 0xFFFF);
  std::memcpy(udp + 8, head, wire::kBthBytes);
  udp[8 + 4] = 0xFF;
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, pseudo, sizeof(pseudo));
  crc = crc32(crc, head + wire::kBthBytes, uInt(head_len - wire::kBthBytes));
  if (len) crc = crc32(crc, payload, uInt(len));
  static const uint8_t kZeros[4] = {0, 0, 0, 0};
  if (pad) crc = crc32(crc, kZeros, uInt(pad));
  return uint32_t(crc);
}

bool TranslateVerbsRequest(wire::Header* h, uint32_t payload_bytes) {
  const uint64_t chunk_elems = payload_bytes / AccumSize(DType(h->dtype));
  const uint64_t field = h->offset;
  h->psn = verbs_wire::RoundPsn(field);
  h->offset = verbs_wire::RoundChunk(field) * chunk_elems;
  return chunk_elems > 0 && h->offset <= wire::kMaxOffset;
}

size_t BuildVerbsResult(VerbsPeer& peer, const wire::Header& round, uint32_t src_ip_be,
                        uint16_t src_port_be, const uint8_t* payload, uint8_t* head,
                        uint8_t* trailer) {
  const VerbsPeerInfo& info = peer.info;
  const uint32_t entry = peer.next_entry;
  peer.next_entry = (entry + 1) % info.entries;
  const uint32_t psn = peer.next_psn;
  peer.next_psn = (psn + 1) & wire::kPsnMask;
  const uint32_t dma_len = uint32_t(verbs_wire::kResultHeaderBytes) + round.length;
  const uint8_t pad = uint8_t(wire::PaddedLength(round.length) - round.length);
  // BTH: RDMA WRITE Only with Immediate, SE/M 0, PadCnt, TVer 0, default P_Key,
  // the worker's QP, AckReq 0 (UC), the aggregator's PSN for this QP.
  head[0] = info.rc ? kOpcodeRcWriteOnlyImm : wire::kOpcodeUcWriteOnlyImm;
  head[1] = uint8_t((pad & 3) << 4);
  Put16(head + 2, wire::kDefaultPKey);
  head[4] = 0;
  Put24(head + 5, info.qpn);
  head[8] = info.rc ? wire::kAckReqBit : 0;  // an RC requester asks for every ACK
  Put24(head + 9, psn);
  // RETH: the ring entry, its R_Key, header + payload; ImmDt: the entry.
  Put64(head + 12, info.ring_va + uint64_t(entry) * info.stride);
  Put32(head + 20, info.rkey);
  Put32(head + 24, dma_len);
  Put32(head + 28, entry);
  wire::Encode(round, head + wire::kHeaderBytes);
  std::memset(trailer, 0, pad);
  const uint32_t icrc = VerbsIcrc(src_ip_be, info.ip, src_port_be, htons(verbs_wire::kRoceV2Port), head,
                             kVerbsResultHeadBytes, payload, round.length, pad);
  std::memcpy(trailer + pad, &icrc, 4);  // little-endian on the wire, as rxe stores it
  return size_t(pad) + wire::kIcrcBytes;
}

Status Aggregator::AttachVerbsPeer(uint32_t index, uint32_t rank, const VerbsPeerInfo& info,
                                   uint32_t* first_psn) {
  // --fanout segment: a job with a verbs rank keeps no group (the daemon withholds it,
  // netreduce/switch/fanout.py), so only a job that got one is refused below.
  if (cfg_.threads != 1 || (HasGroup(cfg_.fanout) && !GroupPerJob(cfg_.fanout))) {
    return InvalidArgument("verbs workers need an aggregator with --threads 1 and unicast "
                           "fan-out (a NIC sends every packet to UDP port 4791, and answers "
                           "only its own QP); this one has --threads " +
                           std::to_string(cfg_.threads) + ", --fanout " + FanoutName(cfg_.fanout));
  }
  if (cfg_.port != verbs_wire::kRoceV2Port) {
    return InvalidArgument("verbs workers need the aggregator's data port to be 4791 (RoCEv2's), "
                           "not " + std::to_string(cfg_.port));
  }
  std::shared_ptr<Job> job = Lookup(index);
  if (!job) return InvalidArgument("no job with index " + std::to_string(index));
  if (rank >= job->size) return InvalidArgument("rank " + std::to_string(rank) + " out of range");
  if (job->group.ip != 0) {
    return InvalidArgument("verbs workers need unicast fan-out, and this job has a multicast "
                           "group (--fanout segment gave it one; run the daemon with --fanout "
                           "unicast)");
  }
  const uint32_t need = uint32_t(verbs_wire::kResultHeaderBytes) + job->pool.payload_bytes();
  if (info.entries == 0 || info.stride < need || info.qpn == 0 || info.qpn > 0xFFFFFF) {
    return InvalidArgument("verbs peer of rank " + std::to_string(rank) + ": result ring of " +
                           std::to_string(info.entries) + " x " + std::to_string(info.stride) +
                           " B cannot hold results of " + std::to_string(need) + " B");
  }
  VerbsPeer& p = job->verbs.peer(rank);
  if (p.active.load(std::memory_order_acquire)) {
    return InvalidArgument("rank " + std::to_string(rank) + " already attached a queue pair");
  }
  // Its results go to the queue pair's address: the one the rank registered from. Its
  // NIC picks the UDP source port of its requests, so from there on any port is its.
  BoundSource& bound = job->ranks[rank].bound;
  if (!bound.Admits(Endpoint{info.ip, 0}, true)) {
    return InvalidArgument("rank " + std::to_string(rank) + "'s queue pair is on " +
                           ToString(IpAddr::V4(info.ip)) + ", but the rank registered the data " +
                           "address " + bound.Describe() + " (they must be the same host address)");
  }
  bound.Store(IpAddr::V4(info.ip), 0, 0);
  p.info = info;
  p.next_psn = uint32_t(std::random_device{}()) & wire::kPsnMask;
  p.next_entry = 0;
  p.rc = VerbsRcState{};
  p.rc.expect_psn = info.worker_psn & wire::kPsnMask;
  *first_psn = p.next_psn;
  if (info.rc) {
    std::lock_guard<std::mutex> lock(verbs_mu_);
    rc_peers_.emplace_back(job, rank);
  }
  p.active.store(true, std::memory_order_release);
  return Status::Ok();
}

void Aggregator::QueueVerbsResult(Job& job, const wire::Header& round, uint32_t rank,
                                  const uint8_t* payload, uint16_t my_port, ResultBatch& out) {
  VerbsPeer& peer = job.verbs.peer(rank);
  const uint32_t local_ip = job.ranks[rank].local_ip.load(std::memory_order_relaxed);
  const size_t k = out.pkts.size();
  uint8_t* head = &out.verbs_heads[k * kVerbsResultHeadBytes];
  uint8_t* trailer = &out.trailers[k * 8];
  wire::Header h = round;
  h.dest_qp = wire::MakeQpn(job.index, rank);
  h.result = true;
  const size_t tlen = BuildVerbsResult(peer, h, local_ip, my_port, payload, head, trailer);
  OutPacket p;
  p.to = Endpoint{peer.info.ip, htons(verbs_wire::kRoceV2Port)};
  p.from_ip = local_ip;
  p.iov[0] = {head, kVerbsResultHeadBytes};
  p.iov[1] = {const_cast<uint8_t*>(payload), h.length};
  p.iov[2] = {trailer, tlen};
  p.iovcnt = 3;
  out.pkts.push_back(p);
  if (peer.info.rc) RememberUnacked(peer, p);
  const size_t bytes = kVerbsResultHeadBytes + wire::PaddedLength(h.length) + wire::kIcrcBytes;
  job.counters.Add(out.thread, &Counters::packets_out);
  job.counters.Add(out.thread, &Counters::bytes_out, bytes);
  global_.Add(out.thread, &Counters::packets_out);
  global_.Add(out.thread, &Counters::bytes_out, bytes);
}

}  // namespace netreduce
