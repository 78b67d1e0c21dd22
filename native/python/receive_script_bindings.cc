// netreduce._native: Aggregator.receive_script, the per-packet path driven by hand for
// tests (tests/unit/test_receive_state.py): datagrams handed to HandleDatagram as data
// threads would, each with the state of the receive it belongs to (receive_state.h),
// receives of two threads interleaved at will, and the control plane's binding and
// removal between any two datagrams. Registered from bindings.cc by BindReceiveScript().
#include <arpa/inet.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "aggregator/aggregator.h"
#include "transport/udp/sockaddr.h"

namespace py = pybind11;
using namespace netreduce;

void Throw(const Status& st);  // bindings.cc: the module's exceptions

namespace {

IpAddr Host(const std::string& host) {
  IpAddr ip;
  Throw(ResolveHost(host, &ip));
  return ip;
}

// One step: ("datagram", receive, thread, packet, from_host, from_port, local_host),
// ("bind", index, rank, host, port, span) or ("remove", index). A datagram's answer:
// where each result it queued goes, "host:port"; the others' is empty.
std::vector<std::string> Step(Aggregator& a, std::map<int, ReceiveState>& receives,
                              const py::tuple& step) {
  const std::string kind = step[0].cast<std::string>();
  std::vector<std::string> sent;
  if (kind == "bind") {
    Throw(a.BindRank(step[1].cast<uint32_t>(), step[2].cast<uint32_t>(),
                     Host(step[3].cast<std::string>()), step[4].cast<uint16_t>(),
                     step[5].cast<uint16_t>()));
  } else if (kind == "remove") {
    Throw(a.RemoveJob(step[1].cast<uint32_t>()));
  } else if (kind == "datagram") {
    const uint32_t thread = step[2].cast<uint32_t>();
    const std::string bytes = step[3].cast<std::string>();
    // Payloads on 64 bytes, as the data threads' buffers hold them (32 bytes in).
    std::vector<uint8_t> mem(bytes.size() + 128);
    uint8_t* buf = mem.data() + ((64 - reinterpret_cast<uintptr_t>(mem.data()) % 64) % 64) + 32;
    std::copy(bytes.begin(), bytes.end(), buf);
    InPacket pkt;
    pkt.buf = buf;
    pkt.cap = pkt.len = bytes.size();
    pkt.from = Endpoint::Of(Host(step[4].cast<std::string>()), htons(step[5].cast<uint16_t>()));
    const IpAddr local = Host(step[6].cast<std::string>());
    if (local.is_v4()) {
      pkt.local_ip = local.v4();
    } else {
      pkt.local_ip6 = local;
    }
    pkt.kernel_checked = true;
    ResultBatch out(nullptr, thread);
    a.HandleDatagram(thread, htons(uint16_t(a.port() + thread)), pkt, out,
                     &receives[step[1].cast<int>()]);
    for (const OutPacket& p : out.pkts) sent.push_back(ToString(p.to));
  } else {
    throw py::value_error("receive_script: unknown step '" + kind + "'");
  }
  return sent;
}

}  // namespace

void BindReceiveScript(py::module_& m) {
  py::object cls = m.attr("Aggregator");
  cls.attr("receive_script") = py::cpp_function(
      [](Aggregator& a, const std::vector<py::tuple>& steps) {
        std::map<int, ReceiveState> receives;  // by the steps' receive number
        std::vector<std::vector<std::string>> answers;
        for (const py::tuple& step : steps) answers.push_back(Step(a, receives, step));
        return answers;
      },
      py::name("receive_script"), py::is_method(cls), py::arg("steps"),
      "The per-packet path by hand, for tests: each step's queued results' destinations.");
}
