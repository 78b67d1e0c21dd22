// The software aggregator: what the FPGA / switch does in NetReduce. It owns T data
// sockets (ports base..base+T-1, transport/make_transport.h); data thread t serves the
// slots s with s % T == t, so every (job, slot) has exactly one writer and the hot
// path takes no lock: each thread reads the job table from its own snapshot and adds
// to its own counter shards (counters.h), so threads share no written cache line.
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
#include "aggregator/receive_state.h"
#include "aggregator/slot_pool.h"
#include "aggregator/verbs_peer.h"
#include "aggregator/uplink.h"
#include "common/fanout.h"
#include "common/status.h"
#include "transport/make_transport.h"
#include "wire/roce.h"

namespace netreduce {

struct AggregatorConfig {
  std::string host = "0.0.0.0";
  uint16_t port = 4791;         // first UDP data port
  // K per job at the largest payload (payload_bytes); a job with a smaller payload gets
  // more, so that every job holds the same bytes in flight: 32 x 64 KiB (2 MiB) by
  // default, 1462 slots of 1432 B at MTU 1500 (SlotsFor). Slot memory is the same.
  uint32_t slots = 32;
  // The largest P a job may get (--payload-bytes; the wire's largest by default).
  // Each job's own P is chosen at admission from its ranks' path MTU (AddJob,
  // SetJobPayload; docs/protocol.md): <= 4096 keeps packets RoCE-sized with ICRC.
  uint32_t payload_bytes = uint32_t(wire::kMaxPayload);
  uint32_t max_jobs = 16;
  uint32_t threads = 1;
  uint64_t memory_limit = uint64_t(1) << 30;  // bytes of slot memory over all jobs
  // --fanout (common/fanout.h): unicast, one result per rank (standard RoCE); with a
  // group (multicast, auto), one result per slot to the job's group group_base +
  // job_index, UDP port `port + threads` (software extension: the network, not the
  // aggregator, replicates the packet, as a switch would); auto adds a unicast copy
  // for each member whose latest contribution does not say the group reaches it;
  // segment is auto for the jobs SetJobGroup gives their group (the others unicast).
  Fanout fanout = Fanout::kSegment;
  std::string group_base = "239.78.0.0";
  UdpOffload udp_offload = UdpOffload::kAuto;  // NETREDUCE_UDP_OFFLOAD (make_transport.h)
  // NETREDUCE_ICRC_CHECK=auto (true): contributions a kernel socket delivered from
  // senders that set the UDP checksum are not checked again (wire::IcrcCheckNeeded).
  bool trust_udp_checksum = true;
  // The data ports' packet path (MakeDataPorts, make_transport.h): "udp" (kernel
  // sockets) or "xdp" (AF_XDP on xdp_device's queues; kernel sockets, with the
  // reason, when it cannot attach and xdp_fallback holds).
  std::string transport = "udp";
  std::string xdp_device;
  std::string xdp_mode = "auto";
  bool xdp_fallback = true;
  // The data threads' nice (setpriority on each thread; < 0 needs CAP_SYS_NICE, and
  // without it they stay at the daemon's own). 0, the default, leaves them as they are: a
  // lower nice lets them preempt busy ranks on a host they share (the testbed, a rank
  // hosting its aggregator), but they then wake per packet instead of per batch and
  // spend ~25 % more CPU per byte (BENCHMARKS.md, issue 33, wirerate and the lead's
  // quiet run of 12-06 04:38).
  int data_nice = 0;
};

struct Job {
  Job(uint32_t index, uint32_t size, uint32_t key, uint32_t slots, uint32_t payload,
      uint32_t threads)
      : index(index), size(size), key(key), pool(slots, payload, size), counters(threads),
        ranks(size), members(size), member(size, 1), expected(size) {
    for (uint32_t r = 0; r < size; ++r) members[r] = r;
  }
  uint32_t index;
  uint32_t size;
  uint32_t key;
  SlotPool pool;
  CounterShards counters;  // shard t: data thread t's
  // Where each rank's packets come from and which local address they target:
  // (ip << 32 | port << 16) packed, written by whichever data thread saw it last.
  // IPv4 only (0 for an IPv6 rank); `full` holds either family (rank_address.h)
  // and is what unicast results are sent by.
  struct RankAddr {
    std::atomic<uint64_t> peer{0};
    std::atomic<uint32_t> local_ip{0};
    RankAddress full;
    std::atomic<uint8_t> group_seen{0};  // its latest contribution's kExtGroupSeen
    // The data address the rank registered (BindRank): its contributions come from
    // there or are dropped (bad_source), so results only ever go there.
    BoundSource bound;
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

// Results of one receive batch waiting to leave in one SendBatch (consecutive results
// to one rank in one GSO send), their headers and trailers kept alive until then; and
// the data thread they belong to, whose counter shards they add to. `sock` null:
// results are discarded (fuzz/ drives the per-packet path with no socket).
struct ResultBatch {
  static constexpr size_t kArena = 2048;  // packets built before a forced flush
  Transport* sock = nullptr;
  uint32_t thread = 0;
  std::vector<OutPacket> pkts;
  std::vector<uint8_t> headers;   // 32 bytes each
  std::vector<uint8_t> trailers;  // 8 each: pad (<= 3) + ICRC (4)
  std::vector<uint8_t> verbs_heads = std::vector<uint8_t>(kArena * kVerbsResultHeadBytes);
  // What packets built for `sock` say of their UDP checksum (wire::kExtUdpChecksum).
  bool udp_checksum = false;
  explicit ResultBatch(Transport* s, uint32_t thread = 0)
      : sock(s), thread(thread), headers(kArena * 32), trailers(kArena * 8),
        udp_checksum(s != nullptr && s->SendsUdpChecksum()) {
    pkts.reserve(kArena);
  }
  bool full() const { return pkts.size() >= kArena; }
  void Flush() {
    if (!pkts.empty() && sock != nullptr) sock->SendBatch(pkts.data(), pkts.size());  // a failed send is a loss
    pkts.clear();
  }
};

// The data threads a configuration runs (--threads, clamped to 1..64 before Start()
// refuses a bad value).
uint32_t DataThreads(const AggregatorConfig& cfg);

class Aggregator {
 public:
  // SO_RCVBUF asked for each data socket: a job's whole window may arrive from every
  // rank at once. Without CAP_NET_ADMIN the kernel caps it at net.core.rmem_max (the
  // daemon warns; transport_info reports what each socket got).
  static constexpr int kReceiveBufferAsked = 64 << 20;

  explicit Aggregator(const AggregatorConfig& cfg);
  ~Aggregator();

  Status Start();
  void Stop();
  const AggregatorConfig& config() const { return cfg_; }
  // The data threads' nice as set (config().data_nice, or what they inherited where the
  // process may not lower it); meaningful once Start() returned.
  int data_nice() const { return data_nice_applied_.load(); }
  uint16_t port() const { return cfg_.port; }
  // The data sockets' packet path (Transport::Describe), e.g. "udp gso+gro"; "" before
  // Start().
  std::string DataPath() const;
  // What carries the data ports (after Start): transport, per-port words, fallback.
  const DataPortsInfo& data_ports() const { return data_ports_; }
  const std::vector<std::unique_ptr<Transport>>& data_transports() const { return sockets_; }

  // Admission: a pool of `payload_bytes` per slot (0 = config().payload_bytes, at
  // most that) for a job of `size` ranks with `key`; refuses cleanly past max_jobs
  // or the memory limit. Returns the job index (its QPN prefix).
  Status AddJob(uint32_t size, uint32_t key, uint32_t* index, uint32_t payload_bytes = 0);
  // Binds (job, rank) to the data address it gave at admission: `ip` and the UDP
  // ports port..port+span-1 (span 0: any port, a verbs rank's NIC choosing it).
  // Contributions for the rank from anywhere else are dropped and counted
  // (bad_source); an unbound rank's are all dropped. May be set again (a spine's
  // member becomes a rack aggregator, a verbs rank's queue pair), never cleared.
  Status BindRank(uint32_t index, uint32_t rank, const IpAddr& ip, uint16_t port, uint16_t span);
  // The address rank is bound to, in words ("no address" when unbound).
  std::string RankSource(uint32_t index, uint32_t rank) const;
  // Shrinks an admitted job's pool to `payload_bytes` (<= its current payload) and
  // returns the memory difference; refused once the job has received a packet.
  Status SetJobPayload(uint32_t index, uint32_t payload_bytes);
  Status RemoveJob(uint32_t index);
  // The slots a job with `payload_bytes` gets: slots x payload_bytes of the config held
  // in flight (at least `slots`, at most 65536, the wire's slot field).
  uint32_t SlotsFor(uint32_t payload_bytes) const;
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
  // group_per_job: gives the job its group (on) or takes it away; refused once the job
  // has received a packet (a data thread reads the group only when a round completes,
  // which needs data from every rank).
  Status SetJobGroup(uint32_t index, bool on);

  // The packet counters over all jobs, plus admission (jobs_admitted, jobs_refused_*),
  // jobs_active, jobs_max, slot_memory_bytes and slot_memory_limit_bytes.
  std::map<std::string, uint64_t> GlobalCounters() const;
  Status JobCounters(uint32_t index, std::map<std::string, uint64_t>* out) const;

  // The per-packet path, the data loop's body: decode and check one datagram that
  // arrived on data port `my_port` (thread `thread_index`'s), apply the slot state
  // machine, queue any results in `out`. Needs no Start(): fuzz/ calls it directly.
  // `receive`: the state of the receive the datagram belongs to (receive_state.h),
  // whose datagrams this thread handles in order; null = a receive of its own.
  void HandleDatagram(uint32_t thread_index, uint16_t my_port, const InPacket& pkt,
                      ResultBatch& out, ReceiveState* receive = nullptr);
  // The `n` datagrams of one receive batch, in order: HandleDatagram with one
  // ReceiveState for them all.
  void HandleReceive(uint32_t thread_index, uint16_t my_port, const InPacket* pkts, size_t n,
                     ResultBatch& out);

 private:
  void Loop(uint32_t thread_index);
  int SetDataNice() const;
  // Queues the stored result of a round for `rank`, or for the job's multicast group
  // when rank == wire::kGroupRank.
  // A held notice (wire::kExtHeld): header only, to `rank` whose contribution `h`
  // asked for one (kAckReqBit) and now waits in its round for other ranks.
  void QueueHeld(Job& job, const wire::Header& h, uint32_t rank, uint16_t my_port,
                 ResultBatch& out);
  // `payload_crc`: wire::PayloadCrc of `payload`, computed once for a fan-out to every
  // rank (FanOut); null = computed with the packet's ICRC.
  // `in_place`: `payload` is the round's accumulator and this is the one packet of the
  // batch that may build itself around it (SlotPool::kHeadroom): a fan-out's group
  // packet, or its first unicast one.
  void QueueResult(Job& job, const wire::Header& round, uint32_t rank, const uint8_t* payload,
                   uint16_t my_port, ResultBatch& out, const uint32_t* payload_crc = nullptr,
                   bool in_place = false);
  // A unicast result to each member, or (outside_group, --fanout auto) to each member
  // whose latest contribution did not say the group reaches it; returns how many.
  size_t UnicastResults(Job& job, const wire::Header& round, const uint8_t* acc,
                        uint16_t my_port, ResultBatch& out, bool outside_group);
  static constexpr uint32_t kGroupProbeEvery = 64;
  void QueueResultPacket(Job& job, const wire::Header& round, uint32_t rank, const uint8_t* payload,
                         uint16_t my_port, ResultBatch& out, const uint32_t* payload_crc = nullptr,
                         bool in_place = false);
  void QueueVerbsResult(Job& job, const wire::Header& round, uint32_t rank, const uint8_t* payload,
                        uint16_t my_port, ResultBatch& out);
  // RC verbs peers (verbs_rc.cc): their ACKs and requests before the slot path (true:
  // consumed), and the retransmission of results they have not acknowledged.
  bool HandleVerbsRc(const InPacket& pkt, uint16_t my_port, ResultBatch& out);
  void VerbsTimers(uint16_t my_port, ResultBatch& out);
  std::mutex verbs_mu_;  // guards rc_peers_
  std::vector<std::pair<std::weak_ptr<Job>, uint32_t>> rc_peers_;
  std::shared_ptr<Job> Lookup(uint32_t index) const;  // control paths: under mu_
  // The data threads' lookup: job `index` in thread `thread`'s snapshot of jobs_, taken
  // again (under mu_) only when jobs_version_ says the table changed; no lock and no
  // shared reference count per packet. `version`: the table's version the snapshot is
  // of (the job stays in it while jobs_version_ still says so).
  Job* JobFor(uint32_t thread, uint32_t index, uint64_t* version = nullptr);
  void JobsChanged() { jobs_version_.fetch_add(1, std::memory_order_release); }  // under mu_
  // Two levels (uplink.cc): the partial sum to the spine, its resends, the spine's
  // result (true when the packet was one), fan-out to the members.
  void StartPartial(Job& job, const wire::Header& round, const uint8_t* acc, uint16_t my_port,
                    ResultBatch& out);
  void SendPartial(Job& job, Uplink::Entry& e, const uint8_t* acc, uint16_t my_port, ResultBatch& out);
  // A member resent its share of a slot whose partial waits on the spine: re-ask.
  void RepeatPartial(Job& job, uint32_t slot, uint32_t shadow, uint16_t my_port, ResultBatch& out);
  bool HandleUplinkResult(uint16_t my_port, const InPacket& pkt, const wire::Header& h,
                          ResultBatch& out);
  // A finished round's result: to the job's multicast group, or one packet per member.
  void FanOut(Job& job, const wire::Header& round, const uint8_t* acc, uint16_t my_port,
              ResultBatch& out);
  void UplinkTimers(uint32_t thread_index, uint16_t my_port, ResultBatch& out);
  UplinkRoutes routes_;

  AggregatorConfig cfg_;
  std::vector<std::unique_ptr<Transport>> sockets_;
  DataPortsInfo data_ports_;  // how sockets_ came to be (an XDP program among them)
  std::vector<std::thread> threads_;
  std::atomic<bool> running_{false};
  // The nice the data threads run at: data_nice once set, else what they inherited.
  std::atomic<int> data_nice_applied_{0};
  std::atomic<uint32_t> threads_niced_{0};  // data threads past SetDataNice (Start waits)
  mutable std::mutex mu_;  // guards jobs_ and memory_used_
  std::vector<std::shared_ptr<Job>> jobs_;  // by index; [0] unused (QP 0/1 are special in IB)
  uint64_t memory_used_ = 0;
  std::atomic<uint64_t> jobs_version_{1};
  struct alignas(64) JobSnapshot {  // one data thread's
    uint64_t version = 0;
    std::vector<std::shared_ptr<Job>> jobs;
  };
  std::vector<JobSnapshot> snapshots_;  // by data thread
  CounterShards global_;
  AdmissionCounters admission_;
};

}  // namespace netreduce
