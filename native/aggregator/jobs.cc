// The aggregator's job table: admission (slot memory, --max-jobs), a job's payload,
// tree and reduction order before its first packet, removal, counters and the data
// threads' lock-free view of the table (JobFor). The data loop is aggregator.cc.
#include <arpa/inet.h>

#include "aggregator/aggregator.h"

namespace netreduce {

uint32_t DataThreads(const AggregatorConfig& cfg) {
  return cfg.threads == 0 ? 1 : (cfg.threads > 64 ? 64 : cfg.threads);
}

// A window of 32 packets of 1432 B is 45 KiB in flight per rank: too little for GSO to
// find runs to coalesce, or for the link to stay busy while results come back. Slots
// scale up as the payload shrinks, holding the bytes of --slots full-size payloads.
uint32_t Aggregator::SlotsFor(uint32_t payload_bytes) const {
  const uint64_t inflight = uint64_t(cfg_.slots) * cfg_.payload_bytes;
  const uint64_t slots = inflight / std::max<uint32_t>(payload_bytes, 1);
  return uint32_t(std::min<uint64_t>(65536, std::max<uint64_t>(cfg_.slots, slots)));
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
  const uint32_t slots = SlotsFor(payload);
  const uint64_t need = uint64_t(slots) * 2 * payload;
  // Resolved before a job slot is taken: a failure here must leave nothing admitted
  // (else each failed attempt would use up one of --max-jobs for good).
  uint32_t group_base = 0;
  if (HasGroup(cfg_.fanout)) {
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
      jobs_[i] = std::make_shared<Job>(i, size, key, slots, payload, DataThreads(cfg_));
      if (HasGroup(cfg_.fanout) && !GroupPerJob(cfg_.fanout)) {
        jobs_[i]->group = Endpoint{htonl(ntohl(group_base) + i), htons(uint16_t(cfg_.port + cfg_.threads))};
      }
      memory_used_ += need;
      JobsChanged();
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
  if (old->counters.Sum(&Counters::packets_in) != 0) {
    return InvalidArgument("job " + std::to_string(index) +
                           " already carries data: its payload is fixed");
  }
  if (payload_bytes == old->pool.payload_bytes()) return Status::Ok();
  // A fresh Job: data threads only ever see a whole one (they hold it by shared_ptr).
  // More slots at the smaller payload, within the memory the admission charged.
  const uint64_t budget = old->pool.memory_bytes() / (2 * uint64_t(payload_bytes));
  const uint32_t slots = uint32_t(std::max<uint64_t>(
      old->pool.slots(), std::min<uint64_t>(SlotsFor(payload_bytes), budget)));
  auto job = std::make_shared<Job>(index, old->size, old->key, slots, payload_bytes,
                                   DataThreads(cfg_));
  job->group = old->group;
  if (old->ordered) {
    job->ordered = std::make_shared<OrderedSlots>(slots, payload_bytes, old->size);
  }
  for (uint32_t r = 0; r < old->size; ++r) job->ranks[r].bound.CopyFrom(old->ranks[r].bound);
  job->members = old->members;
  job->member = old->member;
  job->expected = old->expected;
  job->uplink = old->uplink;
  memory_used_ = memory_used_ - old->memory_bytes() + job->memory_bytes();
  jobs_[index] = job;
  JobsChanged();
  return Status::Ok();
}

Status Aggregator::BindRank(uint32_t index, uint32_t rank, const IpAddr& ip, uint16_t port,
                            uint16_t span) {
  std::lock_guard<std::mutex> lock(mu_);  // against SetJobPayload's copy of the bindings
  if (index == 0 || index >= jobs_.size() || !jobs_[index]) {
    return InvalidArgument("no job with index " + std::to_string(index));
  }
  Job& job = *jobs_[index];
  if (rank >= job.size) {
    return InvalidArgument("rank " + std::to_string(rank) + " out of range for world size " +
                           std::to_string(job.size));
  }
  if (ip.unspecified() || ip.is_multicast()) {
    return InvalidArgument("rank " + std::to_string(rank) + "'s data address " + ToString(ip) +
                           " is not one a packet can come from");
  }
  if (span > BoundSource::kMaxSpan || (span != 0 && (port == 0 || uint32_t(port) + span > 65536))) {
    return InvalidArgument("rank " + std::to_string(rank) + "'s data ports " +
                           std::to_string(port) + " (+" + std::to_string(span) + ") out of range");
  }
  job.ranks[rank].bound.Store(ip, port, span);
  return Status::Ok();
}

std::string Aggregator::RankSource(uint32_t index, uint32_t rank) const {
  std::shared_ptr<Job> job = Lookup(index);
  if (!job || rank >= job->size) return "no address";
  return job->ranks[rank].bound.Describe();
}

Status Aggregator::RemoveJob(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index == 0 || index >= jobs_.size() || !jobs_[index]) {
    return InvalidArgument("no job with index " + std::to_string(index));
  }
  memory_used_ -= jobs_[index]->memory_bytes();
  if (jobs_[index]->uplink) routes_.Remove(index);
  jobs_[index].reset();
  JobsChanged();  // the data threads drop their references at their next look
  return Status::Ok();
}

Status Aggregator::SetJobOrdered(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index == 0 || index >= jobs_.size() || !jobs_[index]) {
    return InvalidArgument("no job with index " + std::to_string(index));
  }
  Job& job = *jobs_[index];
  if (job.ordered) return Status::Ok();
  if (job.counters.Sum(&Counters::packets_in) != 0) {
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

Status Aggregator::SetJobGroup(uint32_t index, bool on) {
  uint32_t group_base = 0;
  if (on) {
    if (!HasGroup(cfg_.fanout)) return InvalidArgument("this aggregator sends no multicast (--fanout unicast)");
    NR_RETURN_IF_ERROR(ResolveIpv4(cfg_.group_base, &group_base));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (index == 0 || index >= jobs_.size() || !jobs_[index]) {
    return InvalidArgument("no job with index " + std::to_string(index));
  }
  Job& job = *jobs_[index];
  if (job.counters.Sum(&Counters::packets_in) != 0) {
    return InvalidArgument("job " + std::to_string(index) + " already carries data: its fan-out is fixed");
  }
  job.group = on ? Endpoint{htonl(ntohl(group_base) + index), htons(uint16_t(cfg_.port + cfg_.threads))}
                 : Endpoint{};
  return Status::Ok();
}

std::shared_ptr<Job> Aggregator::Lookup(uint32_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (index == 0 || index >= jobs_.size()) return nullptr;
  return jobs_[index];
}

Job* Aggregator::JobFor(uint32_t thread, uint32_t index, uint64_t* version) {
  JobSnapshot& snap = snapshots_[thread < snapshots_.size() ? thread : 0];
  if (snap.version != jobs_version_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    snap.jobs = jobs_;
    snap.version = jobs_version_.load(std::memory_order_relaxed);
  }
  if (version != nullptr) *version = snap.version;
  return index < snap.jobs.size() ? snap.jobs[index].get() : nullptr;
}

}  // namespace netreduce
