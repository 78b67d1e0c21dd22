// The software aggregator: what the FPGA / switch does in NetReduce. It owns T UDP
// sockets (ports base..base+T-1); data thread t serves the slots s with s % T == t,
// so every (job, slot) has exactly one writer and the hot path takes no lock.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/counters.h"
#include "aggregator/rank_address.h"
#include "aggregator/ordered_slot.h"
#include "aggregator/slot_pool.h"
#include "aggregator/verbs_peer.h"
#include "aggregator/uplink.h"
#include "common/status.h"
#include "transport/udp/udp_transport.h"
#include "wire/roce.h"

namespace netreduce {

struct AggregatorConfig {
  std::string host = "0.0.0.0";
  uint16_t port = 4791;         // first UDP data port
  uint32_t slots = 32;          // K, per job
  // The largest P a job may get (--payload-bytes; the wire's largest by default).
  // Each job's own P is chosen at admission from its ranks' path MTU (AddJob,
  // SetJobPayload; docs/protocol.md): <= 4096 keeps packets RoCE-sized with ICRC.
  uint32_t payload_bytes = 65464;
  uint32_t max_jobs = 16;
  uint32_t threads = 1;
  uint64_t memory_limit = uint64_t(1) << 30;  // bytes of slot memory over all jobs
  // Fan-out: false = one unicast result per rank (standard RoCE, UC WRITE to each
  // rank's QP); true = one multicast result per slot to the job's group
  // group_base + job_index, UDP port `port + threads` (software extension: the
  // network, not the aggregator, replicates the packet, as a switch would).
  bool multicast = false;
  std::string group_base = "239.78.0.0";
};

struct Job {
  Job(uint32_t index, uint32_t size, uint32_t key, uint32_t slots, uint32_t payload)
      : index(index), size(size), key(key), pool(slots, payload, size), ranks(size),
        members(size), member(size, 1), expected(size) {
    for (uint32_t r = 0; r < size; ++r) members[r] = r;
  }
  uint32_t index;
  uint32_t size;
  uint32_t key;
  SlotPool pool;
  Counters counters;
  // Where each rank's packets come from and which local address they target:
  // (ip << 32 | port << 16) packed, written by whichever data thread saw it last.
  // IPv4 only (0 for an IPv6 rank); `full` holds either family (rank_address.h)
  // and is what unicast results are sent by.
  struct RankAddr {
    std::atomic<uint64_t> peer{0};
    std::atomic<uint32_t> local_ip{0};
    RankAddress full;
  };
  std::vector<RankAddr> ranks;
  Endpoint group;  // multicast destination of results; ip 0 = unicast fan-out
  VerbsPeerTable verbs{size};  // ranks on an RDMA queue pair (verbs_peer.h)
  // NETREDUCE_DETERMINISTIC: contributions folded in rank order (ordered_slot.h);
  // null = in arrival order.
  std::shared_ptr<OrderedSlots> ordered;
  uint64_t memory_bytes() const {
    return pool.memory_bytes() + (ordered ? ordered->memory_bytes() : 0);
  }
  // Whose contributions complete a slot and who gets its result: every rank, except
  // in a two-level tree (SetJobTree; uplink.h): a rack's members, a spine's racks.
  std::vector<uint32_t> members;
  std::vector<uint8_t> member;  // by rank
  uint32_t expected;            // members.size()
  std::shared_ptr<Uplink> uplink;  // a rack aggregator's job: partials go to the spine
};

// Results of one receive batch waiting to leave in one sendmmsg, their headers and
// trailers kept alive until then. `sock` null: results are discarded (fuzz/ drives
// the per-packet path with no socket).
struct ResultBatch {
  static constexpr size_t kArena = 2048;  // packets built before a forced flush
  UdpTransport* sock = nullptr;
  std::vector<OutPacket> pkts;
  std::vector<uint8_t> headers;   // 32 bytes each
  std::vector<uint8_t> trailers;  // 8 each: pad (<= 3) + ICRC (4)
  std::vector<uint8_t> verbs_heads = std::vector<uint8_t>(kArena * kVerbsResultHeadBytes);
  explicit ResultBatch(UdpTransport* s) : sock(s), headers(kArena * 32), trailers(kArena * 8) {
    pkts.reserve(kArena);
  }
  bool full() const { return pkts.size() >= kArena; }
  void Flush() {
    if (!pkts.empty() && sock != nullptr) sock->SendBatch(pkts.data(), pkts.size());  // a failed send is a loss
    pkts.clear();
  }
};

class Aggregator {
 public:
  explicit Aggregator(const AggregatorConfig& cfg);
  ~Aggregator();

  Status Start();
  void Stop();
  const AggregatorConfig& config() const { return cfg_; }
  uint16_t port() const { return cfg_.port; }

  // Admission: a pool of `payload_bytes` per slot (0 = config().payload_bytes, at
  // most that) for a job of `size` ranks with `key`; refuses cleanly past max_jobs
  // or the memory limit. Returns the job index (its QPN prefix).
  Status AddJob(uint32_t size, uint32_t key, uint32_t* index, uint32_t payload_bytes = 0);
  // Shrinks an admitted job's pool to `payload_bytes` (<= its current payload) and
  // returns the memory difference; refused once the job has received a packet.
  Status SetJobPayload(uint32_t index, uint32_t payload_bytes);
  Status RemoveJob(uint32_t index);
  // A verbs rank's queue pair (verbs_peer.cc): its results become RDMA WRITEs into
  // its ring; *first_psn is the PSN of the first one (the QP's expected PSN).
  Status AttachVerbsPeer(uint32_t index, uint32_t rank, const VerbsPeerInfo& info,
                         uint32_t* first_psn);
  // Deterministic reduction for an admitted job (NETREDUCE_DETERMINISTIC, negotiated
  // at admission): its slots fold contributions in rank order; the staging memory
  // (ordered_slot.h) is charged to the memory limit. Refused once the job has
  // received a packet.
  Status SetJobOrdered(uint32_t index);
  // Two levels (uplink.h): the job's members (ranks < its size that complete a slot
  // and receive results) and, on a rack aggregator, the uplink to the spine's job
  // (nullptr on the spine). Refused once the job has received a packet.
  Status SetJobTree(uint32_t index, const std::vector<uint32_t>& members, const UplinkConfig* up);
  // The job's multicast group as "a.b.c.d" and its port, or ("", 0) for unicast.
  std::pair<std::string, uint16_t> Group(uint32_t index) const;

  // The packet counters over all jobs, plus admission (jobs_admitted, jobs_refused_*),
  // jobs_active, jobs_max, slot_memory_bytes and slot_memory_limit_bytes.
  std::map<std::string, uint64_t> GlobalCounters() const;
  Status JobCounters(uint32_t index, std::map<std::string, uint64_t>* out) const;

  // The per-packet path, the data loop's body: decode and check one datagram that
  // arrived on data port `my_port` (thread `thread_index`'s), apply the slot state
  // machine, queue any results in `out`. Needs no Start(): fuzz/ calls it directly.
  void HandleDatagram(uint32_t thread_index, uint16_t my_port, const InPacket& pkt,
                      ResultBatch& out);

 private:
  void Loop(uint32_t thread_index);
  // Queues the stored result of a round for `rank`, or for the job's multicast group
  // when rank == wire::kGroupRank.
  // A held notice (wire::kExtHeld): header only, to `rank` whose contribution `h`
  // asked for one (kAckReqBit) and now waits in its round for other ranks.
  void QueueHeld(Job& job, const wire::Header& h, uint32_t rank, uint16_t my_port,
                 ResultBatch& out);
  void QueueResult(Job& job, const wire::Header& round, uint32_t rank, const uint8_t* payload,
                   uint16_t my_port, ResultBatch& out);
  void QueueResultPacket(Job& job, const wire::Header& round, uint32_t rank, const uint8_t* payload,
                         uint16_t my_port, ResultBatch& out);
  void QueueVerbsResult(Job& job, const wire::Header& round, uint32_t rank, const uint8_t* payload,
                        uint16_t my_port, ResultBatch& out);
  // RC verbs peers (verbs_rc.cc): their ACKs and requests before the slot path (true:
  // consumed), and the retransmission of results they have not acknowledged.
  bool HandleVerbsRc(const InPacket& pkt, uint16_t my_port, ResultBatch& out);
  void VerbsTimers(uint16_t my_port, ResultBatch& out);
  std::mutex verbs_mu_;  // guards rc_peers_
  std::vector<std::pair<std::weak_ptr<Job>, uint32_t>> rc_peers_;
  std::shared_ptr<Job> Lookup(uint32_t index) const;
  // Two levels (uplink.cc): the partial sum to the spine, its resends, the spine's
  // result (true when the packet was one), fan-out to the members.
  void StartPartial(Job& job, const wire::Header& round, const uint8_t* acc, uint16_t my_port,
                    ResultBatch& out);
  void SendPartial(Job& job, Uplink::Entry& e, const uint8_t* acc, uint16_t my_port, ResultBatch& out);
  bool HandleUplinkResult(uint16_t my_port, const InPacket& pkt, const wire::Header& h,
                          ResultBatch& out);
  void FanOut(Job& job, const wire::Header& round, const uint8_t* acc, uint16_t my_port,
              ResultBatch& out);
  void UplinkTimers(uint32_t thread_index, uint16_t my_port, ResultBatch& out);
  UplinkRoutes routes_;

  AggregatorConfig cfg_;
  std::vector<std::unique_ptr<UdpTransport>> sockets_;
  std::vector<std::thread> threads_;
  std::atomic<bool> running_{false};
  mutable std::mutex mu_;  // guards jobs_ and memory_used_
  std::vector<std::shared_ptr<Job>> jobs_;  // by index; [0] unused (QP 0/1 are special in IB)
  uint64_t memory_used_ = 0;
  Counters global_;
  AdmissionCounters admission_;
};

}  // namespace netreduce
