// Transport over one RDMA RC or UC queue pair (libibverbs), the same interface the engine
// uses for transport/udp/. The engine still builds each packet's 32-byte header;
// SendBatch turns it into an RDMA WRITE with Immediate work request (RETH.VA,
// R_Key, ImmDt and length from the header, docs/protocol.md "Verbs peers") and the
// NIC builds BTH/RETH/ImmDt/ICRC itself. Results arrive as RDMA WRITE with Immediate
// into a registered ring; RecvBatch turns each receive completion back into the
// datagram layout the engine parses (header + payload, integrity already checked by
// the NIC's ICRC: InPacket::verified).
//
// Memory: one send ring (payloads are copied in: the engine's buffers belong to the
// caller, who may free them between steps, and a cached registration of freed memory
// would send stale pages) and one result ring, both registered once when the
// transport opens and deregistered when it closes.
// Waiting: the receive CQ has a completion channel; PollFd() is its descriptor and
// PrepareWait() arms it, so an idle engine sleeps in ppoll instead of spinning.
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"
#include "transport/verbs/verbs_device.h"

namespace netreduce {

struct VerbsOptions {
  uint32_t aggregator_ip = 0;   // network order
  uint32_t payload_bytes = 0;   // P of the job
  uint32_t window = 32;         // slots in use: sizes the rings
  std::string device;           // "" = the one holding the local address's GID
  bool rc = false;              // RC queue pair (the NIC repairs loss) instead of UC
};

// What the aggregator needs to answer this queue pair (control plane, verbs_connect).
struct VerbsLocalInfo {
  std::string device;
  int gid_index = -1;
  uint32_t ip = 0;       // network order
  uint32_t qpn = 0;
  uint32_t psn = 0;      // first PSN this QP sends
  uint64_t ring_va = 0;  // result ring
  uint32_t ring_rkey = 0;
  uint32_t ring_entries = 0;
  uint32_t ring_stride = 0;
  uint32_t mtu_bytes = 0;
  bool rc = false;
};

class VerbsTransport : public Transport {
 public:
  static Status Open(const VerbsOptions& opts, std::unique_ptr<VerbsTransport>* out);
  ~VerbsTransport() override;

  const VerbsLocalInfo& info() const { return info_; }
  // INIT -> RTR -> RTS toward the aggregator's QP `remote_qpn` (its PSNs from
  // `remote_psn`), addressed by the IPv4-mapped GID of the aggregator's address.
  Status Connect(uint32_t remote_qpn, uint32_t remote_psn);
  // Device counters of the port (sent/received packets, ...), name -> value; what
  // /sys/class/infiniband/<dev>/ports/<n>/hw_counters holds.
  std::vector<std::pair<std::string, uint64_t>> Counters() const;

  Status SendBatch(OutPacket* pkts, size_t n) override;
  Status RecvBatch(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) override;
  Status PeekHeader(uint8_t* buf, size_t n, int64_t timeout_us, size_t* len,
                    Endpoint* from) override;
  Status RecvScatter(iovec* iov, int iovcnt, size_t* len) override;
  Endpoint local() const override { return Endpoint{info_.ip, htons(4791)}; }
  int PollFd() const override;
  Status PrepareWait(bool* ready) override;
  uint64_t MaxMessageChunks() const override;

 private:
  VerbsTransport() = default;
  Status ReapSends(bool block);
  Status PostRecvs(uint32_t n);

  VerbsOptions opts_;
  VerbsDevice dev_;
  VerbsLocalInfo info_;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  std::vector<uint8_t> send_ring_, recv_ring_;
  ibv_mr* send_mr_ = nullptr;
  ibv_mr* recv_mr_ = nullptr;
  uint32_t send_entries_ = 0, send_stride_ = 0;
  uint64_t send_head_ = 0, send_done_ = 0;  // posted / completed send work requests
  std::vector<ibv_wc> pending_;             // completions polled by PrepareWait
  std::vector<ibv_send_wr> wrs_;            // one batch's chained work requests
  std::vector<ibv_sge> sges_;
  bool connected_ = false;
  uint64_t unacked_events_ = 0;
};

// Whether libibverbs finds a RoCEv2 device for the address that routes to
// `aggregator_ip`; fills `info` with its name, GID index, local address and MTU.
Status ProbeVerbs(uint32_t aggregator_ip, const std::string& device, VerbsLocalInfo* info);

}  // namespace netreduce
