#include "transport/make_transport.h"

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

}  // namespace netreduce
