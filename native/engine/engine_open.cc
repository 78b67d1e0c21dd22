// Making an engine: checking what the aggregator granted, opening its sockets (the
// transport factory, native/transport/make_transport.h) and the state its loop keeps
// from message to message (run_state.h); closing it. The loop itself: engine.cc.
#include <arpa/inet.h>
#include <unistd.h>

#include <random>

#include "engine/engine.h"
#include "engine/run_state.h"
#include "wire/roce.h"

namespace netreduce {
using namespace engine_run;

Engine::Engine(const EngineConfig& cfg) : cfg_(cfg), rng_(cfg.seed ? cfg.seed : std::random_device{}()) {
  window_ = (cfg_.window == 0 || cfg_.window > cfg_.slots) ? cfg_.slots : cfg_.window;
  jumbo_ = cfg_.payload_bytes > wire::kRoceMaxPayload;
  my_qpn_ = wire::MakeQpn(cfg_.job_index, cfg_.rank);
  group_qpn_ = wire::MakeGroupQpn(cfg_.job_index);
  retried_.resize(window_);
  run_.reset(new RunState);
  run_->slots.resize(window_);
  for (uint32_t s = 0; s < window_; ++s) run_->slots[s].slot = s, run_->slots[s].lane = s % cfg_.threads;
  run_->lane_order.resize(cfg_.threads);
  for (auto& o : run_->lane_order) o.Reset((window_ + cfg_.threads - 1) / cfg_.threads);
  run_->sendq.reserve(std::min<size_t>(size_t(window_) * 2, 8192));
  run_->sendq_bytes.reserve(run_->sendq.capacity());
  run_->storage.reset(new uint8_t[kRecvBatch * kRecvBufBytes]);
  run_->in.resize(kRecvDescriptors);
}

Status Engine::Create(const EngineConfig& cfg, std::unique_ptr<Engine>* out) {
  // cfg.data_fd is ours from here: closed on every path that does not hand it on.
  struct FdOwner {
    int fd;
    ~FdOwner() { if (fd >= 0) close(fd); }
    int Release() { const int f = fd; fd = -1; return f; }
  } data_fd{cfg.data_fd};
  if (cfg.size == 0 || cfg.rank >= cfg.size || cfg.size >= wire::kMaxRanks) {
    return InvalidArgument("rank " + std::to_string(cfg.rank) + " / world size " +
                           std::to_string(cfg.size) + " out of range (size 1.." +
                           std::to_string(wire::kMaxRanks - 1) + ")");
  }
  if (cfg.slots == 0 || cfg.slots > 65536 || cfg.payload_bytes < 8 ||
      cfg.payload_bytes > wire::kMaxPayload || cfg.threads == 0) {
    return InvalidArgument("aggregator granted an unusable pool (slots " +
                           std::to_string(cfg.slots) + ", payload " +
                           std::to_string(cfg.payload_bytes) + ")");
  }
  if (!(cfg.drop_rate >= 0.0 && cfg.drop_rate < 1.0)) {
    return InvalidArgument("drop rate must be in [0, 1), got " + std::to_string(cfg.drop_rate));
  }
  std::unique_ptr<Engine> e(new Engine(cfg));
  IpAddr agg_ip;  // IPv4 or IPv6 (transport/udp/sockaddr.h)
  NR_RETURN_IF_ERROR(ResolveHost(cfg.host, &agg_ip));
  e->agg_ = Endpoint::Of(agg_ip, htons(cfg.port));
  IpAddr local_ip;  // of the aggregator's family: the socket below binds it
  NR_RETURN_IF_ERROR(LocalAddressFor(e->agg_, &local_ip));
  if (cfg.transport) {  // a transport the caller opened and connected (verbs)
    if (!cfg.group.empty()) {
      const char* why = "multicast results need the UDP transport";
      if (!VerifiesGroup(cfg.fanout)) return InvalidArgument(why);
      e->group_note_ = why;
    }
    e->sock_ = cfg.transport;
    e->thread_ = std::thread([p = e.get()] { p->ThreadMain(); });
    *out = std::move(e);
    return Status::Ok();
  }
  // GRO joins a run of results into one receive, which then needs a copy into place;
  // datagrams too large for two to share one (loopback's 64 KiB payloads) keep the
  // zero-copy receive below instead (Engine::Run, jumbo path).
  const UdpOffload offload = wire::DatagramBytes(cfg.payload_bytes) * 2 <= kGroBufBytes
                                 ? cfg.udp_offload
                                 : WithoutGro(cfg.udp_offload);
  DataTransportOptions o;
  const std::string buf = ToString(local_ip);
  o.udp.host = buf;
  o.udp.port = 0;
  o.udp.fd = data_fd.Release();  // the rank's registered data socket, when it bound one
  o.offload = offload;
  std::unique_ptr<Transport> udp;
  NR_RETURN_IF_ERROR(MakeDataTransport(o, &udp));
  e->sock_ = std::move(udp);
  if (!cfg.group.empty()) {
    DataTransportOptions g;
    g.udp.join_group = cfg.group;
    g.udp.group_iface = buf;
    g.udp.port = cfg.group_port;
    g.offload = offload;
    Status st = MakeDataTransport(g, &e->group_);
    if (!st.ok() && !VerifiesGroup(cfg.fanout)) return st;
    if (!st.ok()) {
      e->group_.reset();
      e->group_note_ = st.message();
    }
  }
  e->thread_ = std::thread([p = e.get()] { p->ThreadMain(); });
  *out = std::move(e);
  return Status::Ok();
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  Abort("engine closed");
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace netreduce
