#include "transport/make_transport.h"

#include <arpa/inet.h>

#ifdef NETREDUCE_HAVE_XDP
#include "transport/xdp/xdp_transport.h"
#endif

namespace netreduce {

Status ParseUdpOffload(const std::string& text, UdpOffload* out) {
  if (text == "auto" || text.empty()) {
    *out = UdpOffload::kAuto;
  } else if (text == "off") {
    *out = UdpOffload::kOff;
  } else if (text == "gso") {
    *out = UdpOffload::kGso;
  } else if (text == "gro") {
    *out = UdpOffload::kGro;
  } else {
    return InvalidArgument("UDP offload must be auto, off, gso or gro, got '" + text + "'");
  }
  return Status::Ok();
}

const char* UdpOffloadName(UdpOffload o) {
  switch (o) {
    case UdpOffload::kAuto: return "auto";
    case UdpOffload::kOff: return "off";
    case UdpOffload::kGso: return "gso";
    case UdpOffload::kGro: return "gro";
  }
  return "?";
}

UdpOffload WithoutGro(UdpOffload o) {
  if (o == UdpOffload::kAuto) return UdpOffload::kGso;
  if (o == UdpOffload::kGro) return UdpOffload::kOff;
  return o;
}

Status MakeDataTransport(const DataTransportOptions& opts, std::unique_ptr<Transport>* out) {
  UdpOptions u = opts.udp;
  u.gso = opts.offload == UdpOffload::kAuto || opts.offload == UdpOffload::kGso;
  u.gro = opts.offload == UdpOffload::kAuto || opts.offload == UdpOffload::kGro;
  std::unique_ptr<UdpTransport> udp;
  NR_RETURN_IF_ERROR(UdpTransport::Open(u, &udp));
  *out = std::move(udp);
  return Status::Ok();
}

namespace {

Status OpenSockets(const DataPortsOptions& opts, std::vector<std::unique_ptr<Transport>>* out,
                   DataPortsInfo* info) {
  out->clear();
  info->describe.clear();
  for (uint32_t t = 0; t < opts.count; ++t) {
    DataTransportOptions o = opts.base;
    o.udp.port = uint16_t(opts.base.udp.port + t);
    if (opts.base.udp.port == 0 && t > 0) o.udp.port = uint16_t(ntohs((*out)[0]->local().port) + t);
    std::unique_ptr<Transport> s;
    Status st = MakeDataTransport(o, &s);
    if (!st.ok()) {
      out->clear();
      return st;
    }
    info->describe.push_back(s->Describe());
    out->push_back(std::move(s));
  }
  info->transport = "udp";
  return Status::Ok();
}

}  // namespace

Status MakeDataPorts(const DataPortsOptions& opts, std::vector<std::unique_ptr<Transport>>* out,
                     DataPortsInfo* info) {
  *info = DataPortsInfo();
  if (opts.transport == "udp") return OpenSockets(opts, out, info);
  if (opts.transport != "xdp") {
    return InvalidArgument("--transport must be udp or xdp, got '" + opts.transport + "'");
  }
#ifdef NETREDUCE_HAVE_XDP
  XdpSetup s;
  s.udp = opts.base.udp;  // the AF_XDP ports' kernel sockets take what XDP passes: plain ones
  s.device = opts.xdp_device;
  s.count = opts.count;
  s.rx_align_offset = opts.rx_align_offset;
  if (opts.xdp_mode == "native") {
    s.mode = xdp::AttachMode::kNative;
  } else if (opts.xdp_mode == "generic") {
    s.mode = xdp::AttachMode::kGeneric;
  } else if (opts.xdp_mode != "auto") {
    return InvalidArgument("--xdp-mode must be auto, native or generic, got '" + opts.xdp_mode + "'");
  }
  Status st = OpenXdpTransports(s, out, &info->program, &info->notes);
  if (st.ok()) {
    info->transport = "xdp";
    for (auto& p : *out) info->describe.push_back(p->Describe());
    return Status::Ok();
  }
  if (!opts.xdp_fallback) return st;
  const std::string why = st.message();
#else
  const std::string why = "this build has no AF_XDP transport (netreduce._native was built "
                          "without libxdp-dev, libbpf-dev or clang)";
  if (!opts.xdp_fallback) return Status(Code::kRefused, why);
#endif
  NR_RETURN_IF_ERROR(OpenSockets(opts, out, info));
  info->fallback = why;
  return Status::Ok();
}

}  // namespace netreduce
