// The aggregator loop.
//
// Each data thread receives a batch of datagrams with recvmmsg, and for each one:
// decodes and validates the framing (bad packets are dropped and counted by reason,
// never allowed near a slot), finds the job from the destination QP, checks the key,
// the rank, dtype, op and slot, then applies the slot state machine of
// slot_pool.h: a new round resets the slot; a contribution whose rank bit is
// already set is a duplicate and is never added again (a completed slot answers it
// with its stored result, by unicast); the N-th contribution completes the slot and
// its result is fanned out to all N ranks. Results of a whole receive batch leave in
// one sendmmsg. Payloads are summed straight from the receive buffer into the slot
// accumulator (16-bit floats widened to float32, rounded once on completion).
#include "aggregator/aggregator.h"

#include <arpa/inet.h>

#include <cstring>

#include "reduce/dtype.h"
#include "wire/roce.h"

namespace netreduce {
namespace {

// A receive batch spans about 512 KiB of datagrams, so that the kernel's copy and the
// reduction that reads it back meet in L2 (measured: 8 x 64 KiB cut the aggregator's
// CPU per all-reduce by about a quarter against 64 x 64 KiB); at most 128 datagrams.
constexpr size_t kBatchBytes = 512 * 1024;
constexpr size_t kMaxRecvBatch = 128;
constexpr size_t kRecvBufBytes = 65536;

inline uint64_t PackPeer(const Endpoint& e) { return (uint64_t(e.ip) << 32) | (uint64_t(e.port) << 16); }
inline Endpoint UnpackPeer(uint64_t v) { return Endpoint{uint32_t(v >> 32), uint16_t(v >> 16)}; }

}  // namespace

Aggregator::Aggregator(const AggregatorConfig& cfg) : cfg_(cfg) {
  jobs_.resize(std::min<uint32_t>(cfg_.max_jobs, wire::kMaxJobs - 1) + 1);
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
  for (uint32_t t = 0; t < cfg_.threads; ++t) {
    UdpOptions o;
    o.host = cfg_.host;
    o.port = uint16_t(cfg_.port + t);
    o.rcvbuf_bytes = 64 << 20;
    o.sndbuf_bytes = 16 << 20;
    std::unique_ptr<UdpTransport> s;
    Status st = UdpTransport::Open(o, &s);
    if (!st.ok()) {
      sockets_.clear();
      return st;
    }
    if (t == 0 && cfg_.port == 0) cfg_.port = ntohs(s->local().port);
    sockets_.push_back(std::move(s));
  }
  running_ = true;
  for (uint32_t t = 0; t < cfg_.threads; ++t) threads_.emplace_back([this, t] { Loop(t); });
  return Status::Ok();
}

void Aggregator::Stop() {
  running_ = false;
  for (auto& t : threads_) t.join();
  threads_.clear();
  sockets_.clear();
}

static Status CheckPayload(uint32_t payload, uint32_t cap) {
  if (payload < 8 || payload > cap || payload % 8) {
    return InvalidArgument("job payload must be a multiple of 8 in 8.." + std::to_string(cap) +
                           " (--payload-bytes), got " + std::to_string(payload));
  }
  return Status::Ok();
}

Status Aggregator::AddJob(uint32_t size, uint32_t key, uint32_t* index, uint32_t payload_bytes) {
  const uint32_t payload = payload_bytes ? payload_bytes : cfg_.payload_bytes;
  if (size == 0 || size >= wire::kMaxRanks) {
    admission_.Refuse(Refusal::kInvalid);
    return InvalidArgument("world size " + std::to_string(size) + " out of range 1.." +
                           std::to_string(wire::kMaxRanks - 1));
  }
  Status valid = CheckPayload(payload, cfg_.payload_bytes);
  if (!valid.ok()) {
    admission_.Refuse(Refusal::kInvalid);
    return valid;
  }
  const uint64_t need = uint64_t(cfg_.slots) * 2 * payload;
  // Resolved before a job slot is taken: a failure here must leave nothing admitted
  // (else each failed attempt would use up one of --max-jobs for good).
  uint32_t group_base = 0;
  if (cfg_.multicast) {
    Status st = ResolveIpv4(cfg_.group_base, &group_base);
    if (!st.ok()) {
      admission_.Refuse(Refusal::kInvalid);
      return st;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (memory_used_ + need > cfg_.memory_limit) {
    admission_.Refuse(Refusal::kMemory);
    return Status(Code::kRefused,
                  "aggregator slot memory exhausted: job needs " + std::to_string(need) +
                      " bytes (slots x payload x 2), " +
                      std::to_string(cfg_.memory_limit - memory_used_) + " of " +
                      std::to_string(cfg_.memory_limit) + " left");
  }
  for (uint32_t i = 1; i < jobs_.size(); ++i) {
    if (!jobs_[i]) {
      jobs_[i] = std::make_shared<Job>(i, size, key, cfg_.slots, payload);
      if (cfg_.multicast) {
        jobs_[i]->group = Endpoint{htonl(ntohl(group_base) + i), htons(uint16_t(cfg_.port + cfg_.threads))};
      }
      memory_used_ += need;
      *index = i;
      admission_.admitted.fetch_add(1, std::memory_order_relaxed);
      return Status::Ok();
    }
  }
  admission_.Refuse(Refusal::kMaxJobs);
  return Status(Code::kRefused, "aggregator full: --max-jobs " + std::to_string(cfg_.max_jobs) +
                                    " jobs already admitted");
}

Status Aggregator::SetJobPayload(uint32_t index, uint32_t payload_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index == 0 || index >= jobs_.size() || !jobs_[index]) {
    return InvalidArgument("no job with index " + std::to_string(index));
  }
  std::shared_ptr<Job> old = jobs_[index];
  NR_RETURN_IF_ERROR(CheckPayload(payload_bytes, old->pool.payload_bytes()));
  if (old->counters.packets_in.load(std::memory_order_relaxed) != 0) {
    return InvalidArgument("job " + std::to_string(index) +
                           " already carries data: its payload is fixed");
  }
  if (payload_bytes == old->pool.payload_bytes()) return Status::Ok();
  // A fresh Job: data threads only ever see a whole one (they hold it by shared_ptr).
  auto job = std::make_shared<Job>(index, old->size, old->key, old->pool.slots(), payload_bytes);
  job->group = old->group;
  if (old->ordered) {
    job->ordered = std::make_shared<OrderedSlots>(old->pool.slots(), payload_bytes, old->size);
  }
  job->members = old->members;
  job->member = old->member;
  job->expected = old->expected;
  job->uplink = old->uplink;
  memory_used_ = memory_used_ - old->memory_bytes() + job->memory_bytes();
  jobs_[index] = job;
  return Status::Ok();
}

Status Aggregator::RemoveJob(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index == 0 || index >= jobs_.size() || !jobs_[index]) {
    return InvalidArgument("no job with index " + std::to_string(index));
  }
  memory_used_ -= jobs_[index]->memory_bytes();
  if (jobs_[index]->uplink) routes_.Remove(index);
  jobs_[index].reset();
  return Status::Ok();
}

Status Aggregator::SetJobOrdered(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index == 0 || index >= jobs_.size() || !jobs_[index]) {
    return InvalidArgument("no job with index " + std::to_string(index));
  }
  Job& job = *jobs_[index];
  if (job.ordered) return Status::Ok();
  if (job.counters.packets_in.load(std::memory_order_relaxed) != 0) {
    return InvalidArgument("job " + std::to_string(index) +
                           " already carries data: its reduction order is fixed");
  }
  const uint64_t need =
      OrderedSlots::MemoryBytes(job.pool.slots(), job.pool.payload_bytes(), job.size);
  if (memory_used_ + need > cfg_.memory_limit) {
    admission_.Refuse(Refusal::kMemory);
    return Status(Code::kRefused,
                  "aggregator slot memory exhausted: deterministic reduction "
                  "(NETREDUCE_DETERMINISTIC=1) needs " + std::to_string(need) +
                      " more bytes (slots x 2 x (ranks-1) x payload of staging), " +
                      std::to_string(cfg_.memory_limit - memory_used_) + " of " +
                      std::to_string(cfg_.memory_limit) + " left (--memory-mb)");
  }
  // In place: the job's key has not been handed out yet (no rank has its answer), so
  // no data thread can get past the key check to read `ordered` concurrently.
  job.ordered = std::make_shared<OrderedSlots>(job.pool.slots(), job.pool.payload_bytes(), job.size);
  memory_used_ += need;
  return Status::Ok();
}

std::map<std::string, uint64_t> Aggregator::GlobalCounters() const {
  std::map<std::string, uint64_t> m = global_.Snapshot();
  admission_.AddTo(&m);
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t active = 0;
  for (const auto& j : jobs_) active += j ? 1 : 0;
  m["jobs_active"] = active;
  m["jobs_max"] = jobs_.size() - 1;
  m["slot_memory_bytes"] = memory_used_;
  m["slot_memory_limit_bytes"] = cfg_.memory_limit;
  return m;
}

Status Aggregator::JobCounters(uint32_t index, std::map<std::string, uint64_t>* out) const {
  std::shared_ptr<Job> job = Lookup(index);
  if (!job) return InvalidArgument("no job with index " + std::to_string(index));
  *out = job->counters.Snapshot();
  (*out)["slots"] = job->pool.slots();
  (*out)["payload_bytes"] = job->pool.payload_bytes();
  (*out)["slot_memory_bytes"] = job->memory_bytes();
  (*out)["deterministic"] = job->ordered ? 1 : 0;
  (*out)["ordered_staged"] = job->ordered ? job->ordered->staged() : 0;
  (*out)["members"] = job->expected;
  if (job->uplink) job->uplink->AddTo(out);
  return Status::Ok();
}

std::pair<std::string, uint16_t> Aggregator::Group(uint32_t index) const {
  std::shared_ptr<Job> job = Lookup(index);
  if (!job || job->group.ip == 0) return {"", 0};
  std::string s = ToString(job->group);
  return {s.substr(0, s.rfind(':')), ntohs(job->group.port)};
}

std::shared_ptr<Job> Aggregator::Lookup(uint32_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (index == 0 || index >= jobs_.size()) return nullptr;
  return jobs_[index];
}

void Aggregator::Loop(uint32_t thread_index) {
  UdpTransport& sock = *sockets_[thread_index];
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
  std::vector<uint8_t> storage(kMaxRecvBatch * buf_bytes);
  std::vector<InPacket> in(kMaxRecvBatch);
  for (size_t i = 0; i < kMaxRecvBatch; ++i) in[i].buf = storage.data() + i * buf_bytes;
  ResultBatch out(&sock);

  while (running_.load(std::memory_order_relaxed)) {
    size_t got = 0;
    for (size_t i = 0; i < batch; ++i) in[i].cap = buf_bytes;
    // Partials waiting on a spine (uplink.cc) need their timers looked at often.
    Status st = sock.RecvBatch(in.data(), batch, routes_.any() ? 1000 : 100000, &got);
    if (!st.ok()) continue;
    if (got > 0) {
      size_t largest = 0;
      for (size_t i = 0; i < got; ++i) largest = std::max(largest, in[i].len);
      batch = batch_for(largest);
    }
    for (size_t i = 0; i < got; ++i) HandleDatagram(thread_index, my_port, in[i], out);
    UplinkTimers(thread_index, my_port, out);
    VerbsTimers(my_port, out);
    out.Flush();
  }
}

void Aggregator::QueueResult(Job& job, const wire::Header& round, uint32_t rank,
                             const uint8_t* payload, uint16_t my_port, ResultBatch& out) {
  // Owner delivery: every rank but the owner gets the header alone (DMA length 0),
  // which is all its engine needs to move the slot on.
  if (wire::OwnerDelivery(round.msg_id) && rank != wire::MsgOwner(round.msg_id)) {
    wire::Header notice = round;
    notice.length = 0;
    notice.pad = 0;
    return QueueResultPacket(job, notice, rank, payload, my_port, out);
  }
  QueueResultPacket(job, round, rank, payload, my_port, out);
}

void Aggregator::QueueHeld(Job& job, const wire::Header& h, uint32_t rank, uint16_t my_port,
                           ResultBatch& out) {
  wire::Header notice = h;
  notice.length = 0;
  notice.pad = 0;
  notice.ack_req = false;
  notice.held = true;
  job.counters.Add(job.counters.held_notices);
  global_.Add(global_.held_notices);
  QueueResultPacket(job, notice, rank, nullptr, my_port, out);
}

void Aggregator::QueueResultPacket(Job& job, const wire::Header& round, uint32_t rank,
                                   const uint8_t* payload, uint16_t my_port, ResultBatch& out) {
  if (out.full()) out.Flush();
  if (rank != wire::kGroupRank && job.verbs.Active(rank)) {
    return QueueVerbsResult(job, round, rank, payload, my_port, out);
  }
  const bool group = rank == wire::kGroupRank;
  Endpoint to;
  IpAddr local_ip;  // IPv4 or IPv6, as the rank's packets came
  job.ranks[group ? 0 : rank].full.Load(&to, &local_ip);
  if (group) to = job.group;
  const size_t k = out.pkts.size();
  uint8_t* hdr = &out.headers[k * wire::kHeaderBytes];
  uint8_t* trailer = &out.trailers[k * 8];
  wire::Header h = round;
  h.dest_qp = wire::MakeQpn(job.index, rank);
  h.result = true;
  wire::Encode(h, hdr);
  wire::WriteTrailer(h, local_ip, to.address(), my_port, to.port, hdr, payload, trailer);
  OutPacket p;
  p.to = to;
  p.from_ip = local_ip.is_v4() ? local_ip.v4() : 0;
  if (!local_ip.is_v4()) p.from_ip6 = local_ip;
  p.iov[0] = {hdr, wire::kHeaderBytes};
  p.iov[1] = {const_cast<uint8_t*>(payload), h.length};
  p.iov[2] = {trailer, size_t(h.pad) + wire::kIcrcBytes};
  p.iovcnt = 3;
  out.pkts.push_back(p);
  job.counters.Add(job.counters.packets_out);
  job.counters.Add(job.counters.bytes_out, wire::DatagramBytes(h.length));
  global_.Add(global_.packets_out);
  global_.Add(global_.bytes_out, wire::DatagramBytes(h.length));
}

void Aggregator::HandleDatagram(uint32_t thread_index, uint16_t my_port, const InPacket& pkt,
                                ResultBatch& out) {
  global_.Add(global_.packets_in);
  global_.Add(global_.bytes_in, pkt.len);
  wire::Header h;
  if (pkt.len > pkt.cap) {  // the kernel truncated it: larger than any job's payload
    global_.AddDrop(Drop::kBadLength);
    return;
  }
  if (pkt.len >= wire::kBthBytes && VerbsRcOpcode(pkt.buf[0]) && HandleVerbsRc(pkt, my_port, out)) {
    return;  // an RC peer's ACK, or a request its responder state answers without the slots
  }
  switch (wire::Decode(pkt.buf, pkt.len, &h)) {
    case wire::DecodeError::kOk: break;
    case wire::DecodeError::kTruncated: global_.AddDrop(Drop::kTruncated); return;
    case wire::DecodeError::kBadOpcode: global_.AddDrop(Drop::kBadOpcode); return;
    case wire::DecodeError::kBadLength: global_.AddDrop(Drop::kBadLength); return;
  }
  if (h.result && HandleUplinkResult(my_port, pkt, h, out)) return;  // a spine's answer
  std::shared_ptr<Job> jp = Lookup(wire::QpnJob(h.dest_qp));
  if (!jp) {
    global_.AddDrop(Drop::kUnknownJob);
    return;
  }
  Job& job = *jp;
  Counters& jc = job.counters;
  jc.Add(jc.packets_in);
  jc.Add(jc.bytes_in, pkt.len);
  auto drop = [&](Drop d) {
    jc.AddDrop(d);
    global_.AddDrop(d);
  };
  const uint32_t rank = wire::QpnRank(h.dest_qp);
  if (h.key != job.key) return drop(Drop::kBadKey);
  if (rank >= job.size || !job.member[rank]) return drop(Drop::kBadRank);
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
  if (!verbs && !wire::IcrcValid(h, pkt.from.address(), pkt.local_address(), pkt.from.port, my_port, pkt.buf)) {
    return drop(Drop::kBadIcrc);
  }
  job.ranks[rank].peer.store(PackPeer(pkt.from), std::memory_order_relaxed);
  job.ranks[rank].local_ip.store(pkt.local_ip, std::memory_order_relaxed);
  job.ranks[rank].full.Store(pkt.from, pkt.local_address());

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
    global_.Add(global_.rounds_started);
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
    global_.Add(global_.duplicates);
    if (s.complete) {
      jc.Add(jc.retransmitted_results);
      global_.Add(global_.retransmitted_results);
      h.length = s.length;  // an owner's header-only resend gets the whole result
      h.pad = uint8_t(wire::PaddedLength(h.length) - h.length);
      QueueResult(job, h, rank, acc, my_port, out);
    } else {  // (a rack's slot waiting on the spine: its uplink timer resends, uplink.cc)
      job.pool.MarkRepeat(h.slot, h.shadow, rank);
      if (h.ack_req && !verbs) QueueHeld(job, h, rank, my_port, out);
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
  global_.Add(global_.bytes_reduced, h.length);
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
    global_.Add(global_.slots_completed);
    if (job.group.ip != 0 && !wire::OwnerDelivery(h.msg_id)) {
      QueueResult(job, h, wire::kGroupRank, acc, my_port, out);
    } else {
      for (uint32_t r : job.members) {
        h.repeat_seen = !job.verbs.Active(r) && job.pool.Repeated(h.slot, h.shadow, r);
        QueueResult(job, h, r, acc, my_port, out);
      }
    }
  }
}

}  // namespace netreduce
