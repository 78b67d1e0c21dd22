// What a data thread knows of the datagram it admitted last in the receive it is
// working through (Aggregator::HandleReceive): its job, and that its key, rank and
// source passed the checks. With UDP GRO one receive holds a run of a rank's
// datagrams (44 at MTU 1500), all to one QP from one source address, so the job
// lookup and those checks would give the same answer 44 times; a datagram that
// matches the state -- same QP, key, sender and local address, the job table and the
// rank's bound address unchanged since (their versions) -- takes that answer and
// skips them. Anything else takes the whole path, and a stranger's datagram never
// matches (its sender differs).
//
// The rank's address record (Job::RankAddr) is stored by the first datagram of each
// receive, as before by every datagram: two data threads receiving one rank may leave
// it as the other one saw it (rank_address.h), and the next receive of each repairs
// it, so it lags by one receive at most (~256 KiB). Lives on the data thread's stack,
// one per receive: nothing in it is shared.
#pragma once

#include <cstdint>
#include <cstring>

#include "aggregator/rank_address.h"
#include "transport/transport.h"

namespace netreduce {

struct Job;
struct Counters;

class ReceiveState {
 public:
  // The job `dest_qp` names, when the datagram `pkt` with that QP and `key` matches
  // the one admitted last and nothing it was admitted by has changed (`jobs_version`:
  // the job table's version now); else null. The job is only looked at once the
  // version says the thread's snapshot still holds it.
  Job* Match(uint32_t dest_qp, uint32_t key, const InPacket& pkt, uint64_t jobs_version) const {
    if (job_ == nullptr || dest_qp != dest_qp_ || key != key_ || jobs_version != version_) {
      return nullptr;
    }
    if (!SameSource(pkt) || bound_->Sequence() != bound_seq_) return nullptr;
    return job_;
  }
  // `pkt` passed the lookup and the key, rank and source checks: `job` from the
  // snapshot of `jobs_version`, its thread's counter shard, the rank's binding as read
  // at `bound_seq`.
  void Admitted(Job* job, Counters* counters, uint64_t jobs_version, uint32_t dest_qp, uint32_t key,
                const InPacket& pkt, const BoundSource* bound, uint32_t bound_seq) {
    job_ = job;
    counters_ = counters;
    version_ = jobs_version;
    dest_qp_ = dest_qp;
    key_ = key;
    Keep(pkt);
    bound_ = bound;
    bound_seq_ = bound_seq;
    addressed_ = false;
  }
  Counters* counters() const { return counters_; }
  // Whether this receive already stored the admitted rank's address; Addressed() once
  // it has.
  bool addressed() const { return addressed_; }
  void Addressed() { addressed_ = true; }

 private:
  // The sender (its IPv6 address only where it is one) and the local address, field
  // by field: the compare runs for every datagram of a receive (~15 instructions).
  bool SameSource(const InPacket& p) const {
    if (p.from.ip != ip_ || p.from.port != port_ || p.from.v6 != v6_ || p.local_ip != local_ip_) {
      return false;
    }
    uint64_t w[2];
    std::memcpy(w, p.local_ip6.bytes, 16);
    if (((w[0] ^ local_ip6_[0]) | (w[1] ^ local_ip6_[1])) != 0) return false;
    if (!v6_) return true;
    std::memcpy(w, p.from.ip6.bytes, 16);
    return ((w[0] ^ ip6_[0]) | (w[1] ^ ip6_[1])) == 0;
  }
  void Keep(const InPacket& p) {
    ip_ = p.from.ip;
    port_ = p.from.port;
    v6_ = p.from.v6;
    std::memcpy(ip6_, p.from.ip6.bytes, 16);
    local_ip_ = p.local_ip;
    std::memcpy(local_ip6_, p.local_ip6.bytes, 16);
  }

  Job* job_ = nullptr;  // null: nothing admitted yet in this receive
  Counters* counters_ = nullptr;
  uint64_t version_ = 0;
  uint32_t dest_qp_ = 0;
  uint32_t key_ = 0;
  uint32_t ip_ = 0;  // the sender, as Endpoint holds it
  uint16_t port_ = 0;
  bool v6_ = false;
  uint64_t ip6_[2] = {};
  uint32_t local_ip_ = 0;  // the local address, as InPacket holds it
  uint64_t local_ip6_[2] = {};
  const BoundSource* bound_ = nullptr;
  uint32_t bound_seq_ = 0;
  bool addressed_ = false;
};

}  // namespace netreduce
