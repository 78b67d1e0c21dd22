// The rack aggregator's uplink (uplink.h) and the Aggregator members that drive it:
// the tree set-up (SetJobTree), the partial sum sent to the spine, its resends on
// timeout, and the spine's results fanned out to the rack's members.
#include "aggregator/uplink.h"

#include <arpa/inet.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "aggregator/aggregator.h"

namespace netreduce {
namespace {

constexpr uint32_t kMaxRtoUs = 1000000;
// Before the first sample. Not the engine's first timeout (50 ms, engine/rtt.h): that
// one waits out the held notice that ends a job's first message, which 1,000 rank
// threads on shared cores delayed by up to 30 ms. The uplink asks for no held notice,
// and its timeout resends one partial per job per backed-off timeout (uplink.h), so a
// spine still waiting on another rack costs probes 5, 10, 20 ms... apart, while a first
// partial really lost is resent after 5 ms, not 50.
constexpr uint32_t kInitialRtoUs = 5000;
constexpr uint64_t kScanEveryNs = 200000;

uint64_t NextRandom() {
  thread_local uint64_t x =
      (uint64_t(std::hash<std::thread::id>()(std::this_thread::get_id())) << 1) ^ MonotonicNs() ^ 1;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

}  // namespace

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

Uplink::Uplink(const UplinkConfig& cfg, uint32_t slots)
    : cfg_(cfg), slots_(slots), entries_(size_t(slots) * 2),
      answered_(std::max<uint32_t>(1, cfg.spine_threads)) {}

uint32_t Uplink::MaxRtoUs() const { return std::max(kMaxRtoUs, cfg_.rto_floor_us); }

uint32_t Uplink::Rto() const {
  std::lock_guard<std::mutex> lock(est_mu_);
  if (!sampled_) return std::max(kInitialRtoUs, cfg_.rto_floor_us);
  const double rto = srtt_us_ + 4 * rttvar_us_;
  return uint32_t(std::min<double>(MaxRtoUs(), std::max<double>(cfg_.rto_floor_us, rto)));
}

uint32_t Uplink::EstimateUs() const {
  std::lock_guard<std::mutex> lock(est_mu_);
  if (!sampled_) return kInitialRtoUs;
  return uint32_t(std::min<double>(kMaxRtoUs, std::max(1.0, srtt_us_ + 4 * rttvar_us_)));
}

uint32_t Uplink::ReorderWindowUs() const {
  std::lock_guard<std::mutex> lock(est_mu_);
  return sampled_ ? std::max(50u, uint32_t(srtt_us_ / 4)) : 1000u;
}

void Uplink::Sample(uint64_t rtt_ns) {
  const double r = double(rtt_ns) / 1000.0;
  std::lock_guard<std::mutex> lock(est_mu_);
  if (!sampled_) {
    srtt_us_ = r;
    rttvar_us_ = r / 2;
    sampled_ = true;
    return;
  }
  rttvar_us_ = 0.75 * rttvar_us_ + 0.25 * std::abs(srtt_us_ - r);
  srtt_us_ = 0.875 * srtt_us_ + 0.125 * r;
}

bool Uplink::Drop() {
  if (cfg_.drop_rate <= 0) return false;
  const bool drop = double(NextRandom() >> 11) * (1.0 / 9007199254740992.0) < cfg_.drop_rate;
  if (drop) dropped.fetch_add(1, std::memory_order_relaxed);
  return drop;
}

bool Uplink::DropResult() {
  if (cfg_.drop_results > 0 &&
      results_seen_.fetch_add(1, std::memory_order_relaxed) < cfg_.drop_results) {
    dropped.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  return Drop();
}

void Uplink::AddTo(std::map<std::string, uint64_t>* out) const {
  auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  (*out)["uplink_partials_sent"] = get(partials_sent);
  (*out)["uplink_partials_resent"] = get(partials_resent);
  (*out)["uplink_results_received"] = get(results_received);
  (*out)["uplink_results_ignored"] = get(results_ignored);
  (*out)["uplink_dropped"] = get(dropped);
  (*out)["uplink_repeat_resends"] = get(repeat_resends);
  (*out)["uplink_rank"] = cfg_.rank;
  (*out)["uplink_job_index"] = cfg_.job_index;
  (*out)["uplink_rto_us"] = Rto();
}

void UplinkRoutes::Set(uint32_t spine_ip, uint32_t spine_job, uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  routes_[(uint64_t(spine_ip) << 32) | spine_job] = index;
  count_.store(uint32_t(routes_.size()), std::memory_order_relaxed);
}

void UplinkRoutes::Remove(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = routes_.begin(); it != routes_.end();) {
    it = it->second == index ? routes_.erase(it) : std::next(it);
  }
  count_.store(uint32_t(routes_.size()), std::memory_order_relaxed);
}

uint32_t UplinkRoutes::Find(uint32_t spine_ip, uint32_t spine_job) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = routes_.find((uint64_t(spine_ip) << 32) | spine_job);
  return it == routes_.end() ? 0 : it->second;
}

// -- Aggregator members ----------------------------------------------------------

Status Aggregator::SetJobTree(uint32_t index, const std::vector<uint32_t>& members,
                              const UplinkConfig* up) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index == 0 || index >= jobs_.size() || !jobs_[index]) {
    return InvalidArgument("no job with index " + std::to_string(index));
  }
  std::shared_ptr<Job> old = jobs_[index];
  if (old->counters.Sum(&Counters::packets_in) != 0) {
    return InvalidArgument("job " + std::to_string(index) +
                           " already carries data: its tree is fixed");
  }
  if (members.empty()) return InvalidArgument("a tree level needs at least one member");
  std::vector<uint8_t> seen(old->size, 0);
  for (uint32_t r : members) {
    if (r >= old->size || seen[r]) {
      return InvalidArgument("member rank " + std::to_string(r) + " is out of range for world size " +
                             std::to_string(old->size) + " or given twice");
    }
    seen[r] = 1;
  }
  if (up != nullptr && (up->spine_threads == 0 || up->spine_ip == 0 ||
                        up->job_index == 0 || up->job_index >= wire::kMaxJobs ||
                        up->rank >= wire::kMaxRanks - 1)) {
    return InvalidArgument("incomplete uplink: spine address, threads, job index and rank needed");
  }
  // Changed in place (it also carries the deterministic staging and verbs peers):
  // no data can be under way yet, since no rank holds this level's grant before this
  // returns, and the data threads take the job from their snapshots (JobFor).
  Job& job = *old;
  // A spine answers its racks one by one (they are not on one L2 segment); a rack
  // keeps its job's multicast group for its own members.
  if (up == nullptr) job.group = Endpoint{};
  job.members = members;
  job.member = std::move(seen);
  job.expected = uint32_t(members.size());
  if (up != nullptr) {
    job.uplink = std::make_shared<Uplink>(*up, job.pool.slots());
    routes_.Set(up->spine_ip, up->job_index, index);
  }
  return Status::Ok();
}

void Aggregator::SendPartial(Job& job, Uplink::Entry& e, const uint8_t* acc, uint16_t my_port,
                             ResultBatch& out) {
  Uplink& up = *job.uplink;
  const UplinkConfig& c = up.config();
  e.sent_ns = MonotonicNs();
  e.marked_ns = 0;
  if (up.Drop()) return;
  if (out.full()) out.Flush();
  wire::Header h = e.round;
  h.dest_qp = wire::MakeQpn(c.job_index, c.rank);
  h.key = c.key;
  h.result = false;
  h.ack_req = false;  // a member's question is answered here (held notice), not by the spine
  h.udp_checksum = out.udp_checksum;
  // Owner delivery is the rack's business (its members); the spine sums all of it.
  if (wire::OwnerDelivery(h.msg_id)) h.msg_id &= wire::kMsgCounterMask;
  const Endpoint to{c.spine_ip, htons(uint16_t(c.spine_port + h.slot % c.spine_threads))};
  const size_t k = out.pkts.size();
  uint8_t* hdr = &out.headers[k * wire::kHeaderBytes];
  uint8_t* trailer = &out.trailers[k * 8];
  wire::Encode(h, hdr);
  wire::WriteTrailer(h, c.local_ip, to.ip, my_port, to.port, hdr, acc, trailer);
  OutPacket p;
  p.to = to;
  p.from_ip = c.local_ip;
  p.iov[0] = {hdr, wire::kHeaderBytes};
  p.iov[1] = {const_cast<uint8_t*>(acc), h.length};
  p.iov[2] = {trailer, size_t(h.pad) + wire::kIcrcBytes};
  p.iovcnt = 3;
  p.segmentable = true;  // consecutive partials to one spine port: one GSO send
  p.icrc = !h.jumbo;
  out.pkts.push_back(p);
  job.counters.Add(out.thread, &Counters::packets_out);
  job.counters.Add(out.thread, &Counters::bytes_out, wire::DatagramBytes(h.length));
  global_.Add(out.thread, &Counters::packets_out);
  global_.Add(out.thread, &Counters::bytes_out, wire::DatagramBytes(h.length));
}

void Aggregator::StartPartial(Job& job, const wire::Header& round, const uint8_t* acc,
                              uint16_t my_port, ResultBatch& out) {
  Uplink& up = *job.uplink;
  Uplink::Entry& e = up.entry(round.slot, round.shadow);
  e.round = round;
  e.pending = true;
  e.sends = 1;
  e.rto_us = up.Rto();
  SendPartial(job, e, acc, my_port, out);
  e.first_ns = e.sent_ns;
  up.partials_sent.fetch_add(1, std::memory_order_relaxed);
}

// The uplink's timeout resends one partial per job per backed-off timeout (up to 1 s):
// with many partials pending -- most of them waiting on another rack's share -- the
// one whose spine result was lost got its turn only every N seconds, while its
// members' resends reached this slot and were only marked. A member's resend is the
// evidence the timer lacks: the partial is resent at once (the spine counts it as a
// duplicate and answers it with the stored result once the round is complete), at
// most once per the spine's estimated round trip since its last send. Not per the
// entry's timeout: that one carries --uplink-rto-ms's floor and the timer's backoff,
// which are there for the timer's guess, not for a member that knows it lacks the
// result (its own resends are paced by its backed-off timeout). The entry's timeout
// is left as is. Called with the entry's lock held.
void Aggregator::RepeatPartial(Job& job, uint32_t slot, uint32_t shadow, uint16_t my_port,
                               ResultBatch& out) {
  Uplink& up = *job.uplink;
  Uplink::Entry& e = up.entry(slot, shadow);
  if (!e.pending) return;
  const uint64_t now = MonotonicNs();
  if (now < e.sent_ns || now - e.sent_ns < uint64_t(up.EstimateUs()) * 1000) return;
  ++e.sends;
  up.partials_resent.fetch_add(1, std::memory_order_relaxed);
  up.repeat_resends.fetch_add(1, std::memory_order_relaxed);
  SendPartial(job, e, job.pool.accumulator(slot, shadow), my_port, out);
}

bool Aggregator::HandleUplinkResult(uint16_t my_port, const InPacket& pkt, const wire::Header& h,
                                    ResultBatch& out) {
  if (!routes_.any()) return false;
  const uint32_t index = routes_.Find(pkt.from.ip, wire::QpnJob(h.dest_qp));
  if (index == 0) return false;
  Job* jp = JobFor(out.thread, index);
  if (jp == nullptr || !jp->uplink) return false;
  Job& job = *jp;
  Uplink& up = *job.uplink;
  job.counters.Add(out.thread, &Counters::packets_in);
  job.counters.Add(out.thread, &Counters::bytes_in, pkt.len);
  const uint32_t rank = wire::QpnRank(h.dest_qp);
  auto ignore = [&] { up.results_ignored.fetch_add(1, std::memory_order_relaxed); };
  if (h.key != up.config().key || (rank != up.config().rank && rank != wire::kGroupRank) ||
      h.slot >= job.pool.slots()) {
    ignore();
    return true;
  }
  if (up.DropResult()) return true;
  if (wire::IcrcCheckNeeded(h, pkt.kernel_checked, cfg_.trust_udp_checksum) &&
      !wire::IcrcValid(h, pkt.from.ip, pkt.local_ip, pkt.from.port, my_port, pkt.buf)) {
    ignore();
    return true;
  }
  std::unique_lock<std::mutex> lock = up.Lock(h.slot, h.shadow);
  Uplink::Entry& e = up.entry(h.slot, h.shadow);
  SlotState& s = job.pool.state(h.slot, h.shadow);
  if (!e.pending || e.round.psn != h.psn || e.round.offset != h.offset || s.length != h.length ||
      e.round.dtype != h.dtype || e.round.op != h.op) {
    ignore();  // the answer to a resend of a round already complete, or garbage
    return true;
  }
  uint8_t* acc = job.pool.accumulator(h.slot, h.shadow);
  std::memcpy(acc, pkt.buf + wire::kHeaderBytes, h.length);
  e.pending = false;
  s.complete = true;
  const uint64_t now = MonotonicNs();
  if (e.sends == 1) up.Sample(now - e.first_ns);
  up.last_result_ns.store(now, std::memory_order_relaxed);
  // The overtaken rule's clock: when the answered copy left. A resent partial's answer
  // may be the first copy's (Karn), so it counts from the first send: counting from the
  // resend would mark every partial sent before it, and their resends the next ones.
  const uint64_t sent = e.sends == 1 ? e.sent_ns : e.first_ns;
  std::atomic<uint64_t>& answered = up.answered_sent_ns(h.slot);
  uint64_t prev = answered.load(std::memory_order_relaxed);
  while (prev < sent && !answered.compare_exchange_weak(prev, sent)) {
  }
  up.results_received.fetch_add(1, std::memory_order_relaxed);
  job.counters.Add(out.thread, &Counters::slots_completed);
  global_.Add(out.thread, &Counters::slots_completed);
  FanOut(job, e.round, acc, my_port, out);
  return true;
}

void Aggregator::UplinkTimers(uint32_t thread_index, uint16_t my_port, ResultBatch& out) {
  if (!routes_.any()) return;
  thread_local uint64_t last_scan = 0;
  const uint64_t now = MonotonicNs();
  if (now - last_scan < kScanEveryNs) return;
  last_scan = now;
  std::vector<std::shared_ptr<Job>> with_uplink;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& j : jobs_) {
      if (j && j->uplink) with_uplink.push_back(j);
    }
  }
  for (const auto& jp : with_uplink) {
    Uplink& up = *jp->uplink;
    const uint64_t progress = up.last_result_ns.load(std::memory_order_relaxed);
    const uint64_t reorder_ns = uint64_t(up.ReorderWindowUs()) * 1000;
    for (uint32_t slot = thread_index; slot < up.slots(); slot += cfg_.threads) {
      const uint64_t answered = up.answered_sent_ns(slot).load(std::memory_order_relaxed);
      for (uint32_t shadow = 0; shadow < 2; ++shadow) {
        std::unique_lock<std::mutex> lock = up.Lock(slot, shadow);
        Uplink::Entry& e = up.entry(slot, shadow);
        if (!e.pending) continue;
        // Overtaken by a later partial of its lane: resent at once the first time;
        // again only a backed-off timeout after its last send, since a spine that
        // answers later partials may be waiting on the other racks' share of this one
        // (resending each time would flood the spine's link while they recover).
        // As the engine's RACK rule, only after a reorder window (srtt/4) from when it
        // was first seen overtaken: another rack's late share often comes by then.
        if (e.sent_ns < answered && e.marked_ns == 0) e.marked_ns = now;
        if (e.sent_ns < answered && now - e.marked_ns >= reorder_ns &&
            (e.sends == 1 || now - e.sent_ns >= uint64_t(e.rto_us) * 1000)) {
          if (e.sends > 1) e.rto_us = std::min(up.MaxRtoUs(), e.rto_us * 2);
          e.marked_ns = 0;
          ++e.sends;
          up.partials_resent.fetch_add(1, std::memory_order_relaxed);
          SendPartial(*jp, e, jp->pool.accumulator(slot, shadow), my_port, out);
          continue;
        }
        const uint64_t last = std::max(e.sent_ns, progress);  // a result may be newer than `now`
        if (last > now || now - last < uint64_t(e.rto_us) * 1000 ||
            now < up.hold_until_ns.load(std::memory_order_relaxed)) {
          continue;
        }
        e.rto_us = std::min(up.MaxRtoUs(), e.rto_us * 2);
        up.hold_until_ns.store(now + uint64_t(e.rto_us) * 1000, std::memory_order_relaxed);
        ++e.sends;
        up.partials_resent.fetch_add(1, std::memory_order_relaxed);
        SendPartial(*jp, e, jp->pool.accumulator(slot, shadow), my_port, out);
      }
    }
  }
}

}  // namespace netreduce
