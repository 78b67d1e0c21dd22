// The worker side of the data plane: streams one contiguous buffer through the
// aggregator's slot pool and writes the reduced result in place or into another
// buffer. One engine per (job, rank); it runs on its own thread, so a caller
// waiting on a request never holds the GIL.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/fanout.h"
#include "common/status.h"
#include "engine/group_watch.h"
#include "engine/nap.h"
#include "reduce/dtype.h"
#include "transport/make_transport.h"

namespace netreduce {

struct EngineConfig {
  std::string host = "127.0.0.1";  // aggregator address
  uint16_t port = 4791;            // first data port
  uint32_t threads = 1;            // aggregator data ports: slot s goes to port + s % threads
  std::string job = "job";         // for error messages
  uint32_t job_index = 1;
  uint32_t rank = 0;
  uint32_t size = 1;
  uint32_t key = 0;
  uint32_t slots = 32;             // K granted by the aggregator
  uint32_t payload_bytes = 65464;  // P granted by the aggregator
  uint32_t window = 0;             // slots this engine uses (same on every rank); 0 = slots
  double retransmit_ms = 0.5;      // floor of the per-slot timeout (srtt + 4 rttvar above it); doubles per retry, capped at 1 s
  double timeout_s = 30.0;         // a chunk with no result for this long fails the operation
  double drop_rate = 0.0;          // fraction of outgoing packets dropped on purpose (tests)
  uint64_t seed = 0;
  std::string group;               // the job's multicast group of results ("" = none)
  uint16_t group_port = 0;
  // The aggregator's --fanout (common/fanout.h). kAuto: a group this rank cannot join
  // (an IPv6 rank, a verbs transport, a host without a multicast route) is left out,
  // the reason in GroupNote(), and the aggregator sends this rank unicast copies
  // (wire::kExtGroupSeen); otherwise a group that cannot be joined fails Create.
  Fanout fanout = Fanout::kUnicast;
  // Kernel UDP offloads of the engine's sockets (NETREDUCE_UDP_OFFLOAD,
  // transport/make_transport.h); GRO only where two datagrams fit one 64 KiB receive.
  UdpOffload udp_offload = UdpOffload::kAuto;
  // NETREDUCE_ICRC_CHECK=auto: a result its kernel socket delivered, from a sender
  // that set the UDP checksum, is not checked a second time (wire::IcrcCheckNeeded);
  // false ("always"): every result's ICRC is computed.
  bool trust_udp_checksum = true;
  // A transport opened and connected by the caller (transport/verbs/); null = the
  // engine opens a UDP socket toward host:port itself.
  std::shared_ptr<Transport> transport;
  // The data socket the rank bound before it registered (its address is part of its
  // admission: the aggregator takes contributions from there only); the engine takes
  // it over. -1: the engine opens one of its own, toward host:port.
  int data_fd = -1;
};

class Engine {
 public:
  struct Request {
    const uint8_t* src = nullptr;
    uint8_t* dst = nullptr;
    size_t count = 0;  // elements
    DType dtype = DType::kF32;
    Op op = Op::kSum;
    int32_t owner = -1;  // >= 0: reduce-scatter shard, only this rank receives the sum
    // Each result times this as it is copied into dst (float32/float64, sum, owner -1):
    // an Average's 1/N and postscale in the copy the engine makes anyway, instead of a
    // second pass over the whole tensor after it (reduce/dtype.h ScaleInto).
    double scale = 1.0;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
  };

  static Status Create(const EngineConfig& cfg, std::unique_ptr<Engine>* out);
  ~Engine();

  // Queues an all-reduce of `count` elements from src into dst (dst may equal src).
  // Both buffers must stay alive until the request is done.
  // owner >= 0: only rank `owner` receives the result (dst); the others get a
  // completion notice per chunk and leave dst untouched.
  // scale != 1: every result times `scale` in dst (Request::scale).
  std::shared_ptr<Request> Submit(const void* src, void* dst, size_t count, DType dt, Op op,
                                  int32_t owner = -1, double scale = 1.0);
  static bool Done(Request& r);
  static Status Wait(Request& r);
  // Fails pending and later requests with `reason`.
  void Abort(const std::string& reason);
  std::map<std::string, uint64_t> Stats() const;
  std::string AggregatorAddress() const;
  // The packet path of the engine's socket (Transport::Describe), e.g. "udp gso+gro".
  std::string DataPath() const;
  // The engine's socket's SO_RCVBUF as read back (Transport::ReceiveBufferBytes); 0
  // on verbs.
  size_t ReceiveBufferBytes() const;
  // Why the job's multicast group was left out (EngineConfig::fanout auto); "" when
  // joined or when there is none.
  const std::string& GroupNote() const { return group_note_; }

 private:
  explicit Engine(const EngineConfig& cfg);
  void ThreadMain();
  // One request through the window (engine.cc), as the steps of Engine::Message
  // (engine/message.h).
  Status Run(Request& req);
  Status CheckRequest(const Request& req) const;
  class Message;
  std::string Where(uint32_t slot) const;

  EngineConfig cfg_;
  uint32_t window_;
  bool jumbo_;
  std::shared_ptr<Transport> sock_;
  std::unique_ptr<Transport> group_;  // joined multicast group, when the job has one
  std::string group_note_;
  GroupWatch group_watch_;  // engine thread only
  Endpoint agg_;
  uint32_t my_qpn_;
  uint32_t group_qpn_;
  uint64_t next_seq_ = 0;
  // RTT estimate (RFC 6298 style, microseconds) from results of chunks sent once, and
  // of chunks whose retransmission proved spurious; only chunks sent at the head of
  // their lane (see Engine::Run).
  double srtt_us_ = 0.0;
  double rttvar_us_ = 0.0;
  void SampleRtt(double sample_us);
  int64_t Rto() const;  // first timeout of a chunk: srtt + 4 rttvar, floor retransmit_ms
  // Per slot, the chunk last completed there after a retransmission: its message, PSN
  // and first-send-to-result time, kept (across messages) until a second result for it
  // proves the resend needless. sample_us -1 = none.
  struct Retried {
    uint32_t msg_id = 0;
    uint32_t psn = 0;
    int64_t sample_us = -1;
    bool head = false;  // its round trip may feed the estimate (see Engine::Run)
  };
  std::vector<Retried> retried_;
  // What Run() works in, kept from message to message (engine.cc): the window's slot
  // trackers (every one idle between messages), the send queue and the receive
  // buffers. A window is thousands of slots at MTU 1500 (the aggregator holds the
  // same bytes in flight at any payload), and a small all-reduce must not allocate and
  // clear that, nor 4 MiB of receive buffers, each time.
  struct RunState;
  std::unique_ptr<RunState> run_;
  int64_t min_rtt_us_ = 0;  // least round-trip sample (0 = none yet)
  // Interval between consecutive results of a lane while chunks wait in it (EWMA,
  // microseconds): when the next chunk's result is due after one arrives.
  double gap_us_ = 0.0;
  double gapvar_us_ = 0.0;
  void SampleGap(double sample_us);
  int64_t GapTimeout() const;
  uint32_t next_msg_ = 0;
  // RACK-style reorder window steps (engine_timing::kMaxReorderSteps) and the messages
  // since the last resend proven needless by a second result.
  uint32_t reorder_steps_ = 1;
  uint32_t reorder_quiet_ = 0;
  bool late_seen_ = false;  // this message saw such a resend
  int64_t reorder_step_us_ = 0;  // when the window last widened
  // Whether a message may nap: messages whose naps cost delivery rate (engine/nap.h).
  engine_nap::NapRest nap_rest_;
  std::mt19937_64 rng_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  bool stopping_ = false;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;  // guarded by mu_
  Status poisoned_;           // engine thread only: a failure leaves the job out of step
  std::thread thread_;

  // The counters have one writer, the engine thread (Stats() reads them from others):
  // Bump is a relaxed load and store, not a locked read-modify-write, which is a full
  // barrier -- per chunk, it waited for the copy's stores into cold dst to reach the
  // cache.
  static void Bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  std::atomic<uint64_t> packets_sent_{0}, packets_received_{0}, retransmits_{0},
      dropped_by_knob_{0}, ignored_results_{0}, bytes_sent_{0}, messages_{0}, fast_retransmits_{0},
      spurious_retransmits_{0}, timeout_probes_{0}, srtt_stat_us_{0}, rto_stat_us_{0},
      tail_probes_{0}, tail_copies_{0}, repaired_chunks_{0}, repair_wait_us_{0},
      needless_by_repeat_{0}, held_notices_{0}, held_probes_{0}, group_datagrams_{0},
      waits_{0}, naps_{0}, nap_us_{0}, nap_offs_{0}, overtaken_resends_{0}, gap_resends_{0}, first_rtt_stat_us_{0},
      probe_notices_{0};
};

}  // namespace netreduce
