#include "transport/verbs/verbs_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "reduce/dtype.h"
#include "transport/udp/udp_transport.h"
#include "transport/verbs/verbs_wire.h"
#include "wire/roce.h"

namespace netreduce {
namespace {

constexpr uint32_t kAlign = 64;
inline uint32_t AlignUp(uint32_t v) { return (v + kAlign - 1) & ~(kAlign - 1); }
constexpr int64_t kSendStallUs = 5000000;  // a send queue that frees nothing this long is dead

std::string IpString(uint32_t ip) {
  char buf[INET_ADDRSTRLEN];
  in_addr a;
  a.s_addr = ip;
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

Status VerbsError(const std::string& what, int err) {
  return IoError(what + " failed: " + std::strerror(err));
}

}  // namespace

Status ProbeVerbs(uint32_t aggregator_ip, const std::string& device, VerbsLocalInfo* info) {
  uint32_t local_ip = 0;
  NR_RETURN_IF_ERROR(LocalAddressFor(Endpoint{aggregator_ip, htons(verbs_wire::kRoceV2Port)}, &local_ip));
  VerbsDevice dev;
  NR_RETURN_IF_ERROR(FindVerbsDevice(local_ip, device, &dev));
  info->device = dev.name;
  info->gid_index = dev.gid_index;
  info->ip = local_ip;
  info->mtu_bytes = uint32_t(MtuBytes(dev.active_mtu));
  ibv_close_device(dev.ctx);
  return Status::Ok();
}

Status VerbsTransport::Open(const VerbsOptions& opts, std::unique_ptr<VerbsTransport>* out) {
  if (opts.payload_bytes < 8 || opts.window == 0) {
    return InvalidArgument("verbs transport needs a payload and a window");
  }
  std::unique_ptr<VerbsTransport> t(new VerbsTransport());
  t->opts_ = opts;
  uint32_t local_ip = 0;
  NR_RETURN_IF_ERROR(LocalAddressFor(Endpoint{opts.aggregator_ip, htons(verbs_wire::kRoceV2Port)}, &local_ip));
  NR_RETURN_IF_ERROR(FindVerbsDevice(local_ip, opts.device, &t->dev_));
  VerbsLocalInfo& info = t->info_;
  info.device = t->dev_.name;
  info.gid_index = t->dev_.gid_index;
  info.ip = local_ip;
  info.mtu_bytes = uint32_t(MtuBytes(t->dev_.active_mtu));
  if (opts.payload_bytes > verbs_wire::MaxPayloadForMtu(info.mtu_bytes)) {
    return InvalidArgument("job payload " + std::to_string(opts.payload_bytes) + " B exceeds what " +
                           info.device + "'s MTU " + std::to_string(info.mtu_bytes) +
                           " carries in one verbs result packet (" +
                           std::to_string(verbs_wire::MaxPayloadForMtu(info.mtu_bytes)) + " B)");
  }
  ibv_context* ctx = t->dev_.ctx;
  if ((t->pd_ = ibv_alloc_pd(ctx)) == nullptr) return VerbsError("ibv_alloc_pd on " + info.device, errno);
  if ((t->channel_ = ibv_create_comp_channel(ctx)) == nullptr) {
    return VerbsError("ibv_create_comp_channel", errno);
  }
  const int fl = fcntl(t->channel_->fd, F_GETFL);
  fcntl(t->channel_->fd, F_SETFL, fl | O_NONBLOCK);
  t->send_entries_ = std::max<uint32_t>(16, 4 * opts.window);
  t->send_stride_ = AlignUp(opts.payload_bytes);
  info.ring_entries = std::max<uint32_t>(64, 8 * opts.window);
  info.ring_stride = AlignUp(verbs_wire::kResultHeaderBytes + opts.payload_bytes);
  if ((t->send_cq_ = ibv_create_cq(ctx, int(t->send_entries_), nullptr, nullptr, 0)) == nullptr ||
      (t->recv_cq_ = ibv_create_cq(ctx, int(info.ring_entries), nullptr, t->channel_, 0)) == nullptr) {
    return VerbsError("ibv_create_cq", errno);
  }
  t->send_ring_.resize(size_t(t->send_entries_) * t->send_stride_);
  t->recv_ring_.resize(size_t(info.ring_entries) * info.ring_stride);
  t->send_mr_ = ibv_reg_mr(t->pd_, t->send_ring_.data(), t->send_ring_.size(), IBV_ACCESS_LOCAL_WRITE);
  t->recv_mr_ = ibv_reg_mr(t->pd_, t->recv_ring_.data(), t->recv_ring_.size(),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (t->send_mr_ == nullptr || t->recv_mr_ == nullptr) return VerbsError("ibv_reg_mr", errno);
  info.ring_va = uint64_t(reinterpret_cast<uintptr_t>(t->recv_ring_.data()));
  info.ring_rkey = t->recv_mr_->rkey;

  ibv_qp_init_attr qa{};
  qa.send_cq = t->send_cq_;
  qa.recv_cq = t->recv_cq_;
  qa.cap.max_send_wr = t->send_entries_;
  qa.cap.max_recv_wr = info.ring_entries;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.qp_type = opts.rc ? IBV_QPT_RC : IBV_QPT_UC;
  info.rc = opts.rc;
  qa.sq_sig_all = 1;
  if ((t->qp_ = ibv_create_qp(t->pd_, &qa)) == nullptr) {
    return VerbsError(opts.rc ? "ibv_create_qp(RC)" : "ibv_create_qp(UC)", errno);
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = t->dev_.port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  int rc = ibv_modify_qp(t->qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) return VerbsError("ibv_modify_qp(INIT)", rc);
  info.qpn = t->qp_->qp_num;
  info.psn = uint32_t(std::random_device{}()) & wire::kPsnMask;
  NR_RETURN_IF_ERROR(t->PostRecvs(info.ring_entries));
  *out = std::move(t);
  return Status::Ok();
}

VerbsTransport::~VerbsTransport() {
  if (qp_) ibv_destroy_qp(qp_);
  if (send_mr_) ibv_dereg_mr(send_mr_);
  if (recv_mr_) ibv_dereg_mr(recv_mr_);
  if (recv_cq_) {
    if (unacked_events_) ibv_ack_cq_events(recv_cq_, unsigned(unacked_events_));
    ibv_destroy_cq(recv_cq_);
  }
  if (send_cq_) ibv_destroy_cq(send_cq_);
  if (channel_) ibv_destroy_comp_channel(channel_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (dev_.ctx) ibv_close_device(dev_.ctx);
}

Status VerbsTransport::Connect(uint32_t remote_qpn, uint32_t remote_psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = dev_.active_mtu;
  a.dest_qp_num = remote_qpn & 0xFFFFFF;
  a.rq_psn = remote_psn & wire::kPsnMask;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = dev_.port;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.sgid_index = uint8_t(dev_.gid_index);
  uint8_t* g = a.ah_attr.grh.dgid.raw;
  g[10] = g[11] = 0xff;
  std::memcpy(g + 12, &opts_.aggregator_ip, 4);
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (opts_.rc) {  // a responder: no RDMA READ/atomics from the aggregator, RNR timer 1.28 ms
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  int rc = ibv_modify_qp(qp_, &a, mask);
  if (rc != 0) return VerbsError("ibv_modify_qp(RTR) toward " + IpString(opts_.aggregator_ip), rc);
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_RTS;
  s.sq_psn = info_.psn;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (opts_.rc) {  // ACK timeout 4.096 us x 2^14 = 67 ms, 7 retries, RNR retry forever
    s.timeout = 14;
    s.retry_cnt = 7;
    s.rnr_retry = 7;
    s.max_rd_atomic = 1;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  rc = ibv_modify_qp(qp_, &s, mask);
  if (rc != 0) return VerbsError("ibv_modify_qp(RTS)", rc);
  connected_ = true;
  return Status::Ok();
}

Status VerbsTransport::PostRecvs(uint32_t n) {
  // RDMA WRITE with Immediate consumes a receive request but places its data by
  // RETH.VA: the requests carry no buffer.
  for (uint32_t i = 0; i < n; ++i) {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.num_sge = 0;
    const int rc = ibv_post_recv(qp_, &wr, &bad);
    if (rc != 0) return VerbsError("ibv_post_recv", rc);
  }
  return Status::Ok();
}

Status VerbsTransport::ReapSends(bool block) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    ibv_wc wc[32];
    const int got = ibv_poll_cq(send_cq_, 32, wc);
    if (got < 0) return IoError("ibv_poll_cq(send) failed on " + info_.device);
    for (int i = 0; i < got; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        return IoError(std::string("RDMA WRITE to the aggregator at ") + IpString(opts_.aggregator_ip) +
                       " failed on " + info_.device + " QP " + std::to_string(info_.qpn) + ": " +
                       ibv_wc_status_str(wc[i].status));
      }
    }
    send_done_ += uint64_t(got);
    if (!block || send_head_ - send_done_ < send_entries_) return Status::Ok();
    if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(kSendStallUs)) {
      return IoError("send queue of " + info_.device + " QP " + std::to_string(info_.qpn) +
                     " completed nothing for 5 s");
    }
    sched_yield();
  }
}

Status VerbsTransport::SendBatch(OutPacket* pkts, size_t n) {
  if (!connected_) return InvalidArgument("verbs transport used before Connect()");
  NR_RETURN_IF_ERROR(ReapSends(false));
  // One linked list of work requests per batch: one doorbell (for rxe, one system
  // call) for the whole batch rather than one per packet.
  wrs_.resize(n);
  sges_.resize(n);
  size_t chained = 0;
  auto post = [&]() -> Status {
    if (chained == 0) return Status::Ok();
    for (size_t k = 0; k + 1 < chained; ++k) wrs_[k].next = &wrs_[k + 1];
    wrs_[chained - 1].next = nullptr;
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qp_, wrs_.data(), &bad);
    chained = 0;
    if (rc != 0) return VerbsError("ibv_post_send", rc);
    return Status::Ok();
  };
  for (size_t i = 0; i < n; ++i) {
    const OutPacket& p = pkts[i];
    const uint8_t* hdr = static_cast<const uint8_t*>(p.iov[0].iov_base);
    const size_t payload = p.iovcnt > 1 ? p.iov[1].iov_len : 0;
    wire::Header h;
    if (p.iov[0].iov_len != wire::kHeaderBytes ||
        wire::Decode(hdr, wire::DatagramBytes(payload), &h) != wire::DecodeError::kOk ||
        h.length != payload || !ValidDType(h.dtype)) {
      return InvalidArgument("verbs transport: not a netreduce request header");
    }
    const uint64_t chunk_elems = opts_.payload_bytes / AccumSize(DType(h.dtype));
    const uint64_t chunk = h.offset / chunk_elems;
    if (h.offset % chunk_elems != 0 || chunk >= verbs_wire::kMaxChunks) {
      return InvalidArgument("verbs transport: chunk offset " + std::to_string(h.offset) +
                             " is not one of the first 2^16 chunks of a message");
    }
    if (send_head_ - send_done_ >= send_entries_) {
      NR_RETURN_IF_ERROR(post());
      NR_RETURN_IF_ERROR(ReapSends(true));
    }
    uint8_t* slot = &send_ring_[size_t(send_head_ % send_entries_) * send_stride_];
    if (payload) std::memcpy(slot, p.iov[1].iov_base, payload);
    const uint64_t va = (uint64_t(h.dtype & 0xF) << 60) | (uint64_t(h.op & 3) << 58) |
                        (uint64_t(h.shadow & 1) << 57) | (uint64_t(h.slot) << 40) |
                        verbs_wire::PackRound(h.psn, chunk);
    sges_[chained] = ibv_sge{reinterpret_cast<uintptr_t>(slot), uint32_t(payload), send_mr_->lkey};
    ibv_send_wr& wr = wrs_[chained];
    wr = ibv_send_wr{};
    wr.wr_id = send_head_;
    wr.sg_list = payload ? &sges_[chained] : nullptr;
    wr.num_sge = payload ? 1 : 0;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(h.msg_id);
    wr.wr.rdma.remote_addr = va;
    wr.wr.rdma.rkey = h.key;
    ++chained;
    ++send_head_;
  }
  return post();
}

Status VerbsTransport::PrepareWait(bool* ready) {
  *ready = !pending_.empty();
  if (*ready) return Status::Ok();
  for (int pass = 0; pass < 2; ++pass) {
    ibv_wc wc[16];
    const int got = ibv_poll_cq(recv_cq_, 16, wc);
    if (got < 0) return IoError("ibv_poll_cq(recv) failed on " + info_.device);
    if (got > 0) {
      pending_.insert(pending_.end(), wc, wc + got);
      *ready = true;
      return Status::Ok();
    }
    // Arm, then look once more: a completion that landed before the arm raises no event.
    if (pass == 0 && ibv_req_notify_cq(recv_cq_, 0) != 0) return IoError("ibv_req_notify_cq failed");
  }
  return Status::Ok();
}

Status VerbsTransport::RecvBatch(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) {
  *got = 0;
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  while (ibv_get_cq_event(channel_, &ev_cq, &ev_ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
  if (pending_.empty() && timeout_us > 0) {
    bool ready = false;
    NR_RETURN_IF_ERROR(PrepareWait(&ready));
    if (!ready) {
      pollfd pfd{channel_->fd, POLLIN, 0};
      poll(&pfd, 1, int(timeout_us / 1000));
      while (ibv_get_cq_event(channel_, &ev_cq, &ev_ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
    }
  }
  std::vector<ibv_wc> wcs;
  wcs.swap(pending_);
  if (wcs.size() < max) {
    const size_t have = wcs.size();
    wcs.resize(max);
    const int n = ibv_poll_cq(recv_cq_, int(max - have), wcs.data() + have);
    if (n < 0) return IoError("ibv_poll_cq(recv) failed on " + info_.device);
    wcs.resize(have + size_t(n));
  }
  size_t consumed = 0;
  for (size_t i = 0; i < wcs.size(); ++i) {
    const ibv_wc& wc = wcs[i];
    if (*got == max) {  // more than the caller asked for: keep the rest for next time
      pending_.push_back(wc);
      continue;
    }
    ++consumed;
    if (wc.status != IBV_WC_SUCCESS) {
      return IoError(std::string("receive completion error on ") + info_.device + " QP " +
                     std::to_string(info_.qpn) + ": " + ibv_wc_status_str(wc.status));
    }
    const uint32_t entry = ntohl(wc.imm_data);
    if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || entry >= info_.ring_entries ||
        wc.byte_len < verbs_wire::kResultHeaderBytes || wc.byte_len > info_.ring_stride) {
      continue;  // not an aggregator result: nothing the engine could use
    }
    const uint8_t* src = &recv_ring_[size_t(entry) * info_.ring_stride];
    const size_t length = wc.byte_len - verbs_wire::kResultHeaderBytes;
    InPacket& p = pkts[*got];
    const size_t datagram = wire::DatagramBytes(length);
    if (p.cap < datagram) continue;
    std::memcpy(p.buf, src, wc.byte_len);
    std::memset(p.buf + wc.byte_len, 0, datagram - wc.byte_len);  // pad + (checked) ICRC
    p.len = datagram;
    p.from = Endpoint{opts_.aggregator_ip, htons(verbs_wire::kRoceV2Port)};
    p.local_ip = info_.ip;
    p.verified = true;
    ++*got;
  }
  if (consumed) NR_RETURN_IF_ERROR(PostRecvs(uint32_t(consumed)));
  return Status::Ok();
}

Status VerbsTransport::PeekHeader(uint8_t*, size_t, int64_t, size_t* len, Endpoint*) {
  *len = 0;
  return InvalidArgument("the verbs transport has no jumbo (zero-copy peek) path");
}

Status VerbsTransport::RecvScatter(iovec*, int, size_t* len) {
  *len = 0;
  return InvalidArgument("the verbs transport has no jumbo (zero-copy peek) path");
}

int VerbsTransport::PollFd() const { return channel_->fd; }

uint64_t VerbsTransport::MaxMessageChunks() const { return verbs_wire::kMaxChunks; }

std::vector<std::pair<std::string, uint64_t>> VerbsTransport::Counters() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  namespace fs = std::filesystem;
  const fs::path dir = fs::path("/sys/class/infiniband") / info_.device / "ports" /
                       std::to_string(dev_.port) / "hw_counters";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::ifstream f(e.path());
    uint64_t v = 0;
    if (f >> v) out.emplace_back(e.path().filename().string(), v);
  }
  return out;
}

}  // namespace netreduce
