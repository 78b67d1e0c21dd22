// The one place that decides what the engine's and the aggregator's data sockets are.
// Today every one is a kernel UDP socket (transport/udp/), with UDP GSO and GRO where
// the kernel has them unless the offload setting says otherwise (NETREDUCE_UDP_OFFLOAD,
// netreduce/config.py); another packet path (an AF_XDP socket, transport/xdp/) is
// chosen here too, so that neither caller knows which one it got. Verbs queue pairs
// are opened by the caller (transport/verbs/) and never come from here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"
#include "transport/udp/udp_transport.h"

namespace netreduce {

// Which kernel UDP offloads a socket uses: both (auto, each where the kernel and the
// device allow), none (off: one datagram per sendmmsg/recvmmsg entry, as before
// them), or one (gso: segmented sends, plain receives; gro: plain sends, coalesced
// receives). The single ones exist to exercise each fallback path.
enum class UdpOffload : uint8_t { kAuto = 0, kOff, kGso, kGro };
Status ParseUdpOffload(const std::string& text, UdpOffload* out);
const char* UdpOffloadName(UdpOffload o);
// `o` with GRO dropped: a receiver whose datagrams are too large for two to share a
// 64 KiB coalesced receive gains nothing from it and would lose its zero-copy path.
UdpOffload WithoutGro(UdpOffload o);

struct DataTransportOptions {
  UdpOptions udp;  // address, port, buffers, multicast group; its gso/gro are set here
  UdpOffload offload = UdpOffload::kAuto;
};

Status MakeDataTransport(const DataTransportOptions& opts, std::unique_ptr<Transport>* out);

namespace xdp {
class XdpProgram;
}

// The aggregator's data ports: `count` transports on ports base.udp.port + t (thread
// t). transport "udp": MakeDataTransport for each. "xdp": one XDP program on the
// device, an AF_XDP socket on queue t for port + t (transport/xdp/, compiled in where
// libxdp/libbpf exist); where AF_XDP cannot be had — no privilege, a program already
// attached, no such device, not built — the kernel sockets, with the reason in
// DataPortsInfo::fallback, or that reason as the error without xdp_fallback.
struct DataPortsOptions {
  DataTransportOptions base;  // host, first port (0: ephemeral), buffers, UDP offload
  uint32_t count = 1;
  std::string transport = "udp";  // "udp" or "xdp"
  std::string xdp_device;         // empty: the device holding base.udp.host
  std::string xdp_mode = "auto";  // auto, native, generic
  bool xdp_fallback = true;
  uint32_t rx_align_offset = 0;   // AF_XDP: byte of a datagram to put on 64 bytes
};

struct DataPortsInfo {
  std::shared_ptr<xdp::XdpProgram> program;  // xdp: the attached program
  std::string transport;                     // what carries them: "udp" or "xdp"
  std::vector<std::string> describe;         // per port, in words
  std::vector<std::string> notes;            // ports of an xdp setup left on sockets
  std::string fallback;                      // why "xdp" was asked and "udp" given
};

Status MakeDataPorts(const DataPortsOptions& opts, std::vector<std::unique_ptr<Transport>>* out,
                     DataPortsInfo* info);

}  // namespace netreduce
