// netreduce._native: the verbs transport (native/transport/verbs, compiled where
// libibverbs' headers exist: NETREDUCE_HAVE_VERBS) and the aggregator's verbs-peer
// hook (always: it needs no libibverbs). Registered from bindings.cc by BindVerbs().
#include <arpa/inet.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "aggregator/aggregator.h"
#include "transport/transport.h"
#include "transport/udp/udp_transport.h"
#include "transport/verbs/verbs_wire.h"
#ifdef NETREDUCE_HAVE_VERBS
#include "transport/verbs/verbs_transport.h"
#endif

namespace py = pybind11;
using namespace netreduce;

namespace {

PyObject* g_error = nullptr;  // the module's EngineError

void ThrowStatus(const Status& st) {
  if (st.ok()) return;
  if (st.code() == Code::kInvalidArgument) throw py::value_error(st.message());
  PyErr_SetString(g_error, st.message().c_str());
  throw py::error_already_set();
}

uint32_t Ipv4(const std::string& host) {
  uint32_t ip = 0;
  ThrowStatus(ResolveIpv4(host, &ip));
  return ip;
}

std::string IpString(uint32_t ip) {
  char buf[INET_ADDRSTRLEN];
  in_addr a;
  a.s_addr = ip;
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

#ifdef NETREDUCE_HAVE_VERBS
py::dict InfoDict(const VerbsLocalInfo& i) {
  py::dict d;
  d["device"] = i.device; d["gid_index"] = i.gid_index; d["ip"] = IpString(i.ip);
  d["qpn"] = i.qpn; d["psn"] = i.psn; d["ring_va"] = i.ring_va; d["ring_rkey"] = i.ring_rkey;
  d["ring_entries"] = i.ring_entries; d["ring_stride"] = i.ring_stride;
  d["mtu_bytes"] = i.mtu_bytes;
  d["rc"] = i.rc;
  d["max_payload"] = verbs_wire::MaxPayloadForMtu(i.mtu_bytes);
  return d;
}
#endif

}  // namespace

// The Engine's `transport=` argument: None (UDP) or a VerbsTransport.
std::shared_ptr<Transport> TransportFromPy(const py::object& obj) {
  if (obj.is_none()) return nullptr;
#ifdef NETREDUCE_HAVE_VERBS
  return obj.cast<std::shared_ptr<VerbsTransport>>();
#else
  throw py::value_error("this build has no verbs transport");
#endif
}

void BindVerbs(py::module_& m) {
  g_error = m.attr("EngineError").ptr();
#ifdef NETREDUCE_HAVE_VERBS
  m.attr("HAVE_VERBS") = true;
  m.def("probe_verbs", [](const std::string& aggregator, const std::string& device) {
    VerbsLocalInfo info;
    ThrowStatus(ProbeVerbs(Ipv4(aggregator), device, &info));
    return InfoDict(info);
  }, py::arg("aggregator"), py::arg("device") = "",
     "The RDMA device, RoCEv2 GID index, local address and MTU for the path to the aggregator.");
  py::class_<VerbsTransport, std::shared_ptr<VerbsTransport>>(m, "VerbsTransport")
      .def(py::init([](const std::string& aggregator, uint32_t payload_bytes, uint32_t window,
                       const std::string& device, bool rc) {
             VerbsOptions o;
             o.aggregator_ip = Ipv4(aggregator);
             o.payload_bytes = payload_bytes;
             o.window = window;
             o.device = device;
             o.rc = rc;
             std::unique_ptr<VerbsTransport> t;
             ThrowStatus(VerbsTransport::Open(o, &t));
             return std::shared_ptr<VerbsTransport>(std::move(t));
           }),
           py::arg("aggregator"), py::arg("payload_bytes"), py::arg("window"), py::arg("device") = "",
           py::arg("rc") = false)
      .def("info", [](const VerbsTransport& t) { return InfoDict(t.info()); })
      .def("connect", [](VerbsTransport& t, uint32_t qpn, uint32_t psn) {
             ThrowStatus(t.Connect(qpn, psn));
           }, py::arg("qpn"), py::arg("psn"))
      .def("counters", [](const VerbsTransport& t) {
             py::dict d;
             for (const auto& kv : t.Counters()) d[py::str(kv.first)] = kv.second;
             return d;
           });
#else
  m.attr("HAVE_VERBS") = false;
#endif
  py::object cls = py::type::of<Aggregator>();
  cls.attr("attach_verbs_peer") = py::cpp_function(
      [](Aggregator& a, uint32_t index, uint32_t rank, const std::string& ip, uint32_t qpn,
         uint64_t ring_va, uint32_t rkey, uint32_t entries, uint32_t stride, bool rc,
         uint32_t worker_psn) {
        VerbsPeerInfo info;
        info.ip = Ipv4(ip);
        info.qpn = qpn; info.ring_va = ring_va; info.rkey = rkey;
        info.entries = entries; info.stride = stride;
        info.rc = rc; info.worker_psn = worker_psn;
        uint32_t psn = 0;
        ThrowStatus(a.AttachVerbsPeer(index, rank, info, &psn));
        return psn;
      },
      py::name("attach_verbs_peer"), py::is_method(cls), py::sibling(py::getattr(cls, "attach_verbs_peer", py::none())),
      py::arg("index"), py::arg("rank"), py::arg("ip"), py::arg("qpn"), py::arg("ring_va"),
      py::arg("rkey"), py::arg("entries"), py::arg("stride"), py::arg("rc") = false,
      py::arg("worker_psn") = 0,
      "Results for (job index, rank) go to this RDMA queue pair; returns their first PSN.");
}
