// The aggregator loop.
//
// Each data thread receives a batch of datagrams with recvmmsg, and for each one:
// decodes and validates the framing (bad packets are dropped and counted by reason,
// never allowed near a slot), finds the job from the destination QP, checks the key,
// the rank and its source address (the one it registered), dtype, op and slot, then applies the slot state machine of
// slot_pool.h: a new round resets the slot; a contribution whose rank bit is
// already set is a duplicate and is never added again (a completed slot answers it
// with its stored result, by unicast); the N-th contribution completes the slot and
// its result is fanned out to all N ranks. Results of a whole receive batch leave in
// one SendBatch, where consecutive results to one rank leave as one UDP GSO send
// (transport/udp/gso_runs.h); with UDP GRO one receive holds a run of a rank's
// datagrams, which the transport splits before they get here, so the per-packet path
// below is the same either way. Payloads are summed straight from the receive buffer
// into the slot accumulator (16-bit floats widened to float32, rounded once on
// completion).
//
// Threads: thread t owns data port base + t and the slots s % T == t of every job. It
// reads the job table from its own snapshot (JobFor, jobs.cc: refreshed only when a job
// comes, goes or changes) and adds to its own counter shards, so the threads share no
// lock and no written cache line per packet; what is left shared is read-mostly (the
// job's configuration, each rank's address, which is stored only when it changes).
//
// Per receive: with UDP GRO a receive batch holds runs of ~44 datagrams, each run one
// rank's from one address. The job lookup, the key, rank and source checks and the
// rank's address are the same for every datagram of a run, so they are done for its
// first and taken from the receive's state for the rest (receive_state.h: 12 % of the
// path's instructions per contribution at MTU 1500, BENCHMARKS.md, agg58); everything
// the datagram itself says (slot, round, dtype, length, ICRC) is still checked each time.
// Job table, admission and counters: jobs.cc.
#include "aggregator/aggregator.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "reduce/dtype.h"
#include "wire/roce.h"

namespace netreduce {
namespace {

static_assert(SlotPool::kHeadroom == wire::kHeaderBytes, "a result's headers fit before its slot");
static_assert(SlotPool::kTailroom >= wire::kIcrcBytes && SlotPool::kTailroom % 8 == 0,
              "a full chunk's ICRC fits after its slot, the next slot stays aligned");

// A receive batch spans about 256 KiB of datagrams, so that the kernel's copy and the
// reduction that reads it back meet in L2 (measured: 8 x 64 KiB cut the aggregator's
// CPU per all-reduce by about a quarter against 64 x 64 KiB), and leave room there for
// the window's accumulators (4 x 64 KiB: BENCHMARKS.md, aggcpu); at most 128 datagrams.
constexpr size_t kBatchBytes = 256 * 1024;
constexpr size_t kMaxRecvBatch = 128;
constexpr size_t kRecvBufBytes = 65536;
// Packet descriptors for a transport that receives into its own memory (UDP GRO): a
// 256 KiB batch of coalesced receives splits into up to ~180 datagrams at MTU 1500.
constexpr size_t kMaxDescriptors = 512;

inline uint64_t PackPeer(const Endpoint& e) { return (uint64_t(e.ip) << 32) | (uint64_t(e.port) << 16); }
inline Endpoint UnpackPeer(uint64_t v) { return Endpoint{uint32_t(v >> 32), uint16_t(v >> 16)}; }

}  // namespace

Aggregator::Aggregator(const AggregatorConfig& cfg)
    : cfg_(cfg), snapshots_(DataThreads(cfg)), global_(DataThreads(cfg)) {
  jobs_.resize(std::min<uint32_t>(cfg_.max_jobs, wire::kMaxJobs - 1) + 1);
}

std::string Aggregator::DataPath() const {
  return sockets_.empty() ? "" : sockets_[0]->Describe();
}

Aggregator::~Aggregator() { Stop(); }

Status Aggregator::Start() {
  if (cfg_.threads == 0 || cfg_.threads > 64) {
    return InvalidArgument("--threads must be 1..64, got " + std::to_string(cfg_.threads));
  }
  if (cfg_.slots == 0 || cfg_.slots > 65536) {
    return InvalidArgument("--slots must be 1..65536, got " + std::to_string(cfg_.slots));
  }
  if (cfg_.payload_bytes < 8 || cfg_.payload_bytes > wire::kMaxPayload || cfg_.payload_bytes % 8) {
    return InvalidArgument("--payload-bytes must be a multiple of 8 in 8.." +
                           std::to_string(wire::kMaxPayload) + ", got " +
                           std::to_string(cfg_.payload_bytes));
  }
  DataPortsOptions o;
  o.base.udp.host = cfg_.host;
  o.base.udp.port = cfg_.port;
  o.base.udp.rcvbuf_bytes = kReceiveBufferAsked;
  o.base.udp.sndbuf_bytes = 16 << 20;
  o.base.udp.recv_batch_bytes = kBatchBytes;
  o.base.offload = cfg_.udp_offload;
  o.count = cfg_.threads;
  o.transport = cfg_.transport;
  o.xdp_device = cfg_.xdp_device;
  o.xdp_mode = cfg_.xdp_mode;
  o.xdp_fallback = cfg_.xdp_fallback;
  o.rx_align_offset = wire::kHeaderBytes;  // AF_XDP: RoCE payloads on 64 bytes in its frames
  Status st = MakeDataPorts(o, &sockets_, &data_ports_);
  if (!st.ok()) {
    sockets_.clear();
    return st;
  }
  if (cfg_.port == 0) cfg_.port = ntohs(sockets_[0]->local().port);
  running_ = true;
  threads_niced_ = 0;
  for (uint32_t t = 0; t < cfg_.threads; ++t) threads_.emplace_back([this, t] { Loop(t); });
  // data_nice() is read right after Start (the daemon's ready line): wait for the threads
  // to have set theirs (a setpriority call each, microseconds).
  while (threads_niced_.load() < cfg_.threads) std::this_thread::yield();
  return Status::Ok();
}

void Aggregator::Stop() {
  running_ = false;
  for (auto& t : threads_) t.join();
  threads_.clear();
  sockets_.clear();
  data_ports_ = DataPortsInfo();  // detaches the XDP program, once no socket is in its map
}

// A data thread's nice: config().data_nice where the process may set it, else what it
// inherited. On Linux nice is per thread (setpriority on a thread id).
int Aggregator::SetDataNice() const {
  const id_t tid = id_t(syscall(SYS_gettid));
  if (cfg_.data_nice != 0 && setpriority(PRIO_PROCESS, tid, cfg_.data_nice) == 0) return cfg_.data_nice;
  errno = 0;
  const int inherited = getpriority(PRIO_PROCESS, tid);
  return errno == 0 ? inherited : 0;
}

void Aggregator::Loop(uint32_t thread_index) {
  // Named for top/perf and the benchmarks' per-thread CPU (benchmarks/linerate.py).
  pthread_setname_np(pthread_self(), ("nr-data-" + std::to_string(thread_index)).c_str());
  const int nice = SetDataNice();
  if (thread_index == 0) data_nice_applied_ = nice;
  threads_niced_++;
  Transport& sock = *sockets_[thread_index];
  const bool own_buffers = sock.OwnsReceiveBuffers();
  const uint16_t my_port = sock.local().port;
  // Buffers fit the largest payload any job may get; how many datagrams one receive
  // takes follows the size of those that arrive (jobs' payloads follow their paths).
  const size_t datagram = wire::DatagramBytes(cfg_.payload_bytes);
  // Room to see oversize ones; a multiple of 64 so that every buffer, hence every
  // payload (32 bytes in), is aligned for the widest element the kernels load.
  const size_t buf_bytes = std::min(kRecvBufBytes, (datagram + 64 + 63) & ~size_t(63));
  auto batch_for = [](size_t bytes) {
    return std::min(kMaxRecvBatch, std::max<size_t>(1, kBatchBytes / std::max<size_t>(bytes, 1)));
  };
  size_t batch = batch_for(datagram);
  std::vector<uint8_t> storage(own_buffers ? 0 : kMaxRecvBatch * buf_bytes);
  std::vector<InPacket> in(own_buffers ? kMaxDescriptors : kMaxRecvBatch);
  ResultBatch out(&sock, thread_index);

  while (running_.load(std::memory_order_relaxed)) {
    size_t got = 0;
    if (!own_buffers) {
      for (size_t i = 0; i < batch; ++i) in[i].buf = storage.data() + i * buf_bytes, in[i].cap = buf_bytes;
    }
    // Partials waiting on a spine (uplink.cc) need their timers looked at often.
    Status st = sock.RecvBatch(in.data(), own_buffers ? in.size() : batch,
                               routes_.any() ? 1000 : 100000, &got);
    JobFor(thread_index, 0);  // a removed job's memory goes back even on an idle thread
    if (!st.ok()) continue;
    if (got > 0 && !own_buffers) {
      size_t largest = 0;
      for (size_t i = 0; i < got; ++i) largest = std::max(largest, in[i].len);
      batch = batch_for(largest);
    }
    HandleReceive(thread_index, my_port, in.data(), got, out);
    UplinkTimers(thread_index, my_port, out);
    VerbsTimers(my_port, out);
    out.Flush();
  }
}

void Aggregator::QueueResult(Job& job, const wire::Header& round, uint32_t rank,
                             const uint8_t* payload, uint16_t my_port, ResultBatch& out,
                             const uint32_t* payload_crc, bool in_place) {
  // Owner delivery: every rank but the owner gets the header alone (DMA length 0),
  // which is all its engine needs to move the slot on.
  if (wire::OwnerDelivery(round.msg_id) && rank != wire::MsgOwner(round.msg_id)) {
    wire::Header notice = round;
    notice.length = 0;
    notice.pad = 0;
    return QueueResultPacket(job, notice, rank, payload, my_port, out);
  }
  QueueResultPacket(job, round, rank, payload, my_port, out, payload_crc, in_place);
}

void Aggregator::QueueHeld(Job& job, const wire::Header& h, uint32_t rank, uint16_t my_port,
                           ResultBatch& out) {
  wire::Header notice = h;
  notice.length = 0;
  notice.pad = 0;
  notice.ack_req = false;
  notice.held = true;
  job.counters.Add(out.thread, &Counters::held_notices);
  global_.Add(out.thread, &Counters::held_notices);
  QueueResultPacket(job, notice, rank, nullptr, my_port, out);
}

void Aggregator::FanOut(Job& job, const wire::Header& round, const uint8_t* acc, uint16_t my_port,
                        ResultBatch& out) {
  if (job.group.ip != 0 && !wire::OwnerDelivery(round.msg_id)) {
    if (!VerifiesGroup(cfg_.fanout)) {
      return QueueResult(job, round, wire::kGroupRank, acc, my_port, out, nullptr, true);
    }
    // auto: while no member says the group reaches it (a routed network, IPv6 or
    // verbs ranks), one result in kGroupProbeEvery still goes to the group, so that a
    // member it does reach can say so; the rest go by unicast alone.
    const size_t copies = UnicastResults(job, round, acc, my_port, out, true);
    if (copies < job.members.size() || round.slot % kGroupProbeEvery == 0) {
      QueueResult(job, round, wire::kGroupRank, acc, my_port, out, nullptr, true);
    }
    return;
  }
  UnicastResults(job, round, acc, my_port, out, false);
}

size_t Aggregator::UnicastResults(Job& job, const wire::Header& round, const uint8_t* acc,
                                  uint16_t my_port, ResultBatch& out, bool outside_group) {
  // One packet per member, alike but for the headers: the payload's CRC once, each
  // packet's ICRC from it (owner delivery sends the payload to one rank; a jumbo
  // packet has no ICRC).
  const bool shareable = !round.jumbo && !wire::OwnerDelivery(round.msg_id);
  uint32_t crc = 0;
  bool have_crc = false;
  wire::Header h = round;
  size_t sent = 0;
  for (uint32_t r : job.members) {
    const bool repeated = !job.verbs.Active(r) && job.pool.Repeated(h.slot, h.shadow, r);
    // A rank the group reaches gets a copy too when its resend came while the slot still
    // waited: the group's packet cannot say "repeat seen" for one rank, and without the
    // mark that rank takes its needless resend for loss (engine/repair.h, tail copies).
    if (outside_group && job.ranks[r].group_seen.load(std::memory_order_relaxed) && !repeated) {
      continue;
    }
    if (shareable && !have_crc) {
      crc = wire::PayloadCrc(acc, round.length, round.pad);
      have_crc = true;
    }
    h.repeat_seen = repeated;
    // The group's packet, if one follows, is built around the accumulator; else the first.
    QueueResult(job, h, r, acc, my_port, out, have_crc ? &crc : nullptr,
                !outside_group && sent == 0);
    ++sent;
  }
  if (outside_group && sent > 0) {
    job.counters.Add(out.thread, &Counters::group_unicast_copies, sent);
    global_.Add(out.thread, &Counters::group_unicast_copies, sent);
  }
  return sent;
}

void Aggregator::QueueResultPacket(Job& job, const wire::Header& round, uint32_t rank,
                                   const uint8_t* payload, uint16_t my_port, ResultBatch& out,
                                   const uint32_t* payload_crc, bool in_place) {
  if (out.full()) out.Flush();
  if (rank != wire::kGroupRank && job.verbs.Active(rank)) {
    return QueueVerbsResult(job, round, rank, payload, my_port, out);
  }
  const bool group = rank == wire::kGroupRank;
  const size_t k = out.pkts.size();
  // Built in place: a packet assembled on the stack and copied into the batch cost a
  // store-forwarding stall per result.
  OutPacket& p = out.pkts.emplace_back();
  Endpoint& to = p.to;
  IpAddr local_ip;  // IPv4 or IPv6, as the rank's packets came
  job.ranks[group ? 0 : rank].full.Load(&to, &local_ip);
  if (group) to = job.group;
  // In place: header, payload, pad and ICRC one contiguous datagram in the slot's
  // memory, one iovec for the kernel's copy instead of three (the iovec walk cost the
  // send ~40 % more kernel time per byte: BENCHMARKS.md, Line rate per core, 12-04).
  // The bytes past the payload are the accumulator's own (a short chunk's) or its
  // tailroom; nothing reads them before the slot's next round writes its data.
  in_place = in_place && payload != nullptr && round.length > 0;
  uint8_t* const slot_mem = const_cast<uint8_t*>(payload);
  uint8_t* hdr = in_place ? slot_mem - wire::kHeaderBytes : &out.headers[k * wire::kHeaderBytes];
  uint8_t* trailer = in_place ? slot_mem + round.length : &out.trailers[k * 8];
  wire::Header h = round;
  h.dest_qp = wire::MakeQpn(job.index, rank);
  h.result = true;
  h.udp_checksum = out.udp_checksum;
  wire::Encode(h, hdr);
  wire::WriteTrailer(h, local_ip, to.address(), my_port, to.port, hdr, payload, trailer,
                     payload_crc);
  p.from_ip = local_ip.is_v4() ? local_ip.v4() : 0;
  if (!local_ip.is_v4()) p.from_ip6 = local_ip;
  if (in_place) {
    p.iov[0] = {hdr, wire::kHeaderBytes + h.length + h.pad + wire::kIcrcBytes};
    p.iovcnt = 1;
  } else {
    p.iov[0] = {hdr, wire::kHeaderBytes};
    p.iov[1] = {const_cast<uint8_t*>(payload), h.length};
    p.iov[2] = {trailer, size_t(h.pad) + wire::kIcrcBytes};
    p.iovcnt = 3;
  }
  p.segmentable = true;
  p.icrc = !h.jumbo;
  const size_t bytes = wire::DatagramBytes(h.length);
  job.counters.Add(out.thread, &Counters::packets_out);
  job.counters.Add(out.thread, &Counters::bytes_out, bytes);
  global_.Add(out.thread, &Counters::packets_out);
  global_.Add(out.thread, &Counters::bytes_out, bytes);
}

void Aggregator::HandleReceive(uint32_t thread_index, uint16_t my_port, const InPacket* pkts,
                               size_t n, ResultBatch& out) {
  ReceiveState receive;
  for (size_t i = 0; i < n; ++i) HandleDatagram(thread_index, my_port, pkts[i], out, &receive);
}

void Aggregator::HandleDatagram(uint32_t thread_index, uint16_t my_port, const InPacket& pkt,
                                ResultBatch& out, ReceiveState* receive) {
  out.thread = thread_index;
  Counters& gc = global_.at(thread_index);
  gc.Add(gc.packets_in);
  gc.Add(gc.bytes_in, pkt.len);
  wire::Header h;
  if (pkt.len > pkt.cap) {  // the kernel truncated it: larger than any job's payload
    gc.AddDrop(Drop::kBadLength);
    return;
  }
  if (pkt.len >= wire::kBthBytes && VerbsRcOpcode(pkt.buf[0]) && HandleVerbsRc(pkt, my_port, out)) {
    return;  // an RC peer's ACK, or a request its responder state answers without the slots
  }
  switch (wire::Decode(pkt.buf, pkt.len, &h)) {
    case wire::DecodeError::kOk: break;
    case wire::DecodeError::kTruncated: gc.AddDrop(Drop::kTruncated); return;
    case wire::DecodeError::kBadOpcode: gc.AddDrop(Drop::kBadOpcode); return;
    case wire::DecodeError::kBadLength: gc.AddDrop(Drop::kBadLength); return;
  }
  if (h.result && HandleUplinkResult(my_port, pkt, h, out)) return;  // a spine's answer
  const uint32_t rank = wire::QpnRank(h.dest_qp);
  // The job, key, rank and source as the receive's last admitted datagram had them
  // (receive_state.h), or looked up and checked.
  Job* jp = receive != nullptr
                ? receive->Match(h.dest_qp, h.key, pkt, jobs_version_.load(std::memory_order_acquire))
                : nullptr;
  const bool known = jp != nullptr;
  uint64_t version = 0;
  if (!known) jp = JobFor(thread_index, wire::QpnJob(h.dest_qp), &version);
  if (jp == nullptr) {
    gc.AddDrop(Drop::kUnknownJob);
    return;
  }
  Job& job = *jp;
  Counters& jc = known ? *receive->counters() : job.counters.at(thread_index);
  jc.Add(jc.packets_in);
  jc.Add(jc.bytes_in, pkt.len);
  auto drop = [&](Drop d) {
    jc.AddDrop(d);
    gc.AddDrop(d);
  };
  if (!known) {
    if (h.key != job.key) return drop(Drop::kBadKey);
    if (rank >= job.size || !job.member[rank]) return drop(Drop::kBadRank);
    // Only from the data address the rank registered: a replay of its packets from
    // anywhere else reaches no slot and, above all, is never answered.
    const BoundSource& bound = job.ranks[rank].bound;
    uint32_t bound_seq = 0;
    if (!bound.Admits(pkt.from, false, &bound_seq)) return drop(Drop::kBadSource);
    if (receive != nullptr) {
      receive->Admitted(jp, &jc, version, h.dest_qp, h.key, pkt, &bound, bound_seq);
    }
  }
  if (h.result) return drop(Drop::kResultFlag);
  if (!ValidDType(h.dtype)) return drop(Drop::kBadDtype);
  if (!ValidOp(h.op)) return drop(Drop::kBadOp);
  const bool verbs = job.verbs.Active(rank);  // round PSN and offset ride in RETH.VA
  if (verbs && !TranslateVerbsRequest(&h, job.pool.payload_bytes())) return drop(Drop::kBadLength);
  if (h.slot >= job.pool.slots() || h.slot % cfg_.threads != thread_index) {
    return drop(Drop::kBadSlot);
  }
  if (wire::OwnerDelivery(h.msg_id) && wire::MsgOwner(h.msg_id) >= job.size) {
    return drop(Drop::kBadRank);
  }
  const DType dt = DType(h.dtype);
  const size_t esize = ElementSize(dt);
  const size_t n = h.length / esize;
  // A reduce-scatter owner's contribution to its own shard is header only: it counts
  // in the slot and adds nothing; the owner combines its own data with the result.
  const bool marker =
      h.length == 0 && wire::OwnerDelivery(h.msg_id) && rank == wire::MsgOwner(h.msg_id);
  if (h.length % esize != 0 || n * AccumSize(dt) > job.pool.payload_bytes()) {
    return drop(Drop::kBadLength);
  }
  const uint8_t* payload = pkt.buf + wire::kHeaderBytes;
  // A NIC's ICRC covers its IPv4 ID, which a UDP socket does not see: not checkable here.
  if (!verbs && wire::IcrcCheckNeeded(h, pkt.kernel_checked, cfg_.trust_udp_checksum) &&
      !wire::IcrcValid(h, pkt.from.address(), pkt.local_address(), pkt.from.port, my_port, pkt.buf)) {
    return drop(Drop::kBadIcrc);
  }
  // Stored only when they change: every data thread sees this rank's packets, and an
  // unconditional store would move the line between their cores on every packet.
  // Looked at once per receive (the rest of its datagrams come from the same address:
  // receive_state.h), where another thread's store is repaired.
  Job::RankAddr& ra = job.ranks[rank];
  if (receive == nullptr || !receive->addressed()) {
    const uint64_t peer = PackPeer(pkt.from);
    if (ra.peer.load(std::memory_order_relaxed) != peer) ra.peer.store(peer, std::memory_order_relaxed);
    if (ra.local_ip.load(std::memory_order_relaxed) != pkt.local_ip) {
      ra.local_ip.store(pkt.local_ip, std::memory_order_relaxed);
    }
    ra.full.Store(pkt.from, pkt.local_ip, pkt.local_ip6);
    if (receive != nullptr) receive->Addressed();
  }
  if (VerifiesGroup(cfg_.fanout) && ra.group_seen.load(std::memory_order_relaxed) != h.group_seen) {
    ra.group_seen.store(h.group_seen, std::memory_order_relaxed);
  }

  std::unique_lock<std::mutex> tree_lock;  // a rack's slots: spine results come on any thread
  if (job.uplink) tree_lock = job.uplink->Lock(h.slot, h.shadow);
  SlotState& s = job.pool.state(h.slot, h.shadow);
  if (s.psn < 0 || PsnNewer(h.psn, uint32_t(s.psn))) {
    // A new round: the previous one on this (slot, shadow) is known to all ranks.
    s.psn = int32_t(h.psn);
    s.count = 0;
    s.complete = false;
    s.dtype = h.dtype;
    s.op = h.op;
    s.length = h.length;
    s.offset = h.offset;
    s.msg_id = h.msg_id;
    job.pool.ResetRound(h.slot, h.shadow);
    if (job.uplink) job.uplink->entry(h.slot, h.shadow).pending = false;
    jc.Add(jc.rounds_started);
    gc.Add(gc.rounds_started);
  } else if (uint32_t(s.psn) != h.psn) {
    return drop(Drop::kStale);
  } else if (s.dtype != h.dtype || s.op != h.op ||
             (s.length != h.length && !marker && s.length != 0) ||
             s.offset != h.offset || s.msg_id != h.msg_id) {
    return drop(Drop::kInconsistent);
  }
  // The round's first data (a round the owner's header-only packet began has none).
  const bool first_data = !marker && (s.count == 0 || s.length == 0);
  uint8_t* acc = job.pool.accumulator(h.slot, h.shadow);
  if (!job.pool.TestAndSet(h.slot, h.shadow, rank)) {
    jc.Add(jc.duplicates);
    gc.Add(gc.duplicates);
    if (s.complete) {
      jc.Add(jc.retransmitted_results);
      gc.Add(gc.retransmitted_results);
      h.length = s.length;  // an owner's header-only resend gets the whole result
      h.pad = uint8_t(wire::PaddedLength(h.length) - h.length);
      QueueResult(job, h, rank, acc, my_port, out);
    } else {
      job.pool.MarkRepeat(h.slot, h.shadow, rank);
      if (h.ack_req && !verbs) QueueHeld(job, h, rank, my_port, out);
      // A rack's slot waiting on the spine: the member's resend says its result is
      // missing; the partial is resent now (uplink.cc), not when the job's turn comes.
      if (job.uplink && s.count == job.expected) RepeatPartial(job, h.slot, h.shadow, my_port, out);
    }
    return;
  }
  if (first_data) s.length = h.length;
  if (job.ordered) {  // NETREDUCE_DETERMINISTIC: rank order, not arrival order
    job.ordered->Add(h.slot, h.shadow, rank, dt, Op(h.op), acc, payload, s.length / esize,
                     s.count == 0, marker);
  } else if (!marker) {
    Accumulate(dt, Op(h.op), acc, payload, n, first_data);
  }
  ++s.count;
  jc.Add(jc.bytes_reduced, h.length);
  gc.Add(gc.bytes_reduced, h.length);
  // The rank asked whether its contribution arrived (it has no round-trip estimate
  // yet): yes, and the round waits for others -- so it waits too, without resending.
  const bool held = h.ack_req && !verbs && (s.count != job.expected || job.uplink);
  if (held) QueueHeld(job, h, rank, my_port, out);
  if (s.count == job.expected) {
    const size_t rn = s.length / esize;  // the round's elements (a marker carries none)
    h.length = s.length;  // the result carries them, whoever's packet completed the slot
    h.pad = uint8_t(wire::PaddedLength(h.length) - h.length);
    if (job.ordered) job.ordered->Complete(h.slot, h.shadow, dt, Op(h.op), acc, rn);
    Finish(dt, acc, rn);
    if (job.uplink) return StartPartial(job, h, acc, my_port, out);  // the spine completes it
    s.complete = true;
    jc.Add(jc.slots_completed);
    gc.Add(gc.slots_completed);
    FanOut(job, h, acc, my_port, out);
  }
}

}  // namespace netreduce
