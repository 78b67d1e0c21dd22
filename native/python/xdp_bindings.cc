// netreduce._native: the AF_XDP transport (native/transport/xdp, compiled where
// libxdp's and libbpf's headers exist: NETREDUCE_HAVE_XDP). XdpPorts opens the data
// ports a daemon would (one program on the device, one AF_XDP socket per queue) and
// moves raw datagrams through them, for the tests and for `netreduce info`'s probe;
// the aggregator opens its own through the same OpenXdpTransports. Registered from
// bindings.cc by BindXdp().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#ifdef NETREDUCE_HAVE_XDP
#include <arpa/inet.h>

#include "transport/udp/sockaddr.h"
#include "transport/xdp/xdp_transport.h"
#endif

namespace py = pybind11;

namespace {

#ifdef NETREDUCE_HAVE_XDP
using namespace netreduce;

PyObject* g_xdp_error = nullptr;    // the module's EngineError
PyObject* g_xdp_refused = nullptr;  // its RefusedError: no privilege, a program attached...

void ThrowXdp(const Status& st) {
  if (st.ok()) return;
  if (st.code() == Code::kInvalidArgument) throw py::value_error(st.message());
  PyErr_SetString(st.code() == Code::kRefused ? g_xdp_refused : g_xdp_error, st.message().c_str());
  throw py::error_already_set();
}

xdp::AttachMode ParseMode(const std::string& m) {
  if (m == "auto") return xdp::AttachMode::kAuto;
  if (m == "native") return xdp::AttachMode::kNative;
  if (m == "generic") return xdp::AttachMode::kGeneric;
  throw py::value_error("XDP attach mode must be auto, native or generic, got '" + m + "'");
}

class XdpPorts {
 public:
  XdpPorts(const std::string& host, uint16_t port, const std::string& device, uint32_t threads,
           const std::string& mode, bool zero_copy) {
    XdpSetup s;
    s.udp.host = host;
    s.udp.port = port;
    s.device = device;
    s.count = threads;
    s.mode = ParseMode(mode);
    s.try_zero_copy = zero_copy;
    ThrowXdp(OpenXdpTransports(s, &ports_, &program_, &notes_));
  }
  Transport& at(size_t i) {
    if (i >= ports_.size()) throw py::index_error("no data port " + std::to_string(i));
    return *ports_[i];
  }
  XdpTransport* xdp_at(size_t i) { return dynamic_cast<XdpTransport*>(&at(i)); }

  py::list Describe() {
    py::list out;
    for (size_t i = 0; i < ports_.size(); ++i) {
      XdpTransport* x = xdp_at(i);
      out.append(x ? x->Describe() : std::string("kernel UDP socket"));
    }
    return out;
  }
  uint16_t Port(size_t i) { return ntohs(at(i).local().port); }

  void Send(size_t i, const std::string& dst, uint16_t dst_port, py::bytes data,
            const std::string& src) {
    IpAddr to, from;
    ThrowXdp(ResolveHost(dst, &to));
    if (!src.empty()) ThrowXdp(ResolveHost(src, &from));
    std::string bytes = data;
    OutPacket p;
    p.to = Endpoint::Of(to, htons(dst_port));
    if (from.is_v4()) p.from_ip = from.v4(); else p.from_ip6 = from;
    p.iov[0] = {const_cast<char*>(bytes.data()), bytes.size()};
    p.iovcnt = 1;
    py::gil_scoped_release nogil;
    ThrowXdp(at(i).SendBatch(&p, 1));
  }

  // [(payload, (src host, src port), local host)] of up to `max` datagrams, waiting
  // up to `timeout_ms` for the first.
  py::list Recv(size_t i, double timeout_ms, size_t max) {
    std::vector<std::vector<uint8_t>> bufs(max, std::vector<uint8_t>(65536));
    std::vector<InPacket> in(max);
    for (size_t k = 0; k < max; ++k) {
      in[k].buf = bufs[k].data();
      in[k].cap = bufs[k].size();
    }
    size_t got = 0;
    {
      py::gil_scoped_release nogil;
      ThrowXdp(at(i).RecvBatch(in.data(), max, int64_t(timeout_ms * 1000), &got));
    }
    py::list out;
    for (size_t k = 0; k < got; ++k) {
      out.append(py::make_tuple(
          py::bytes(reinterpret_cast<const char*>(in[k].buf), std::min(in[k].len, in[k].cap)),
          py::make_tuple(ToString(in[k].from.address()), ntohs(in[k].from.port)),
          ToString(in[k].local_address())));
    }
    return out;
  }

  std::map<std::string, uint64_t> Stats(size_t i) {
    XdpTransport* x = xdp_at(i);
    return x ? x->Stats() : std::map<std::string, uint64_t>{};
  }
  py::dict Info() {
    py::dict d;
    d["device"] = program_->device().name;
    d["mode"] = program_->mode();
    d["program_id"] = program_->program_id();
    d["multi_buffer_program"] = program_->multi_buffer();
    d["notes"] = notes_;
    XdpTransport* x = xdp_at(0);
    d["zero_copy"] = x && x->socket().zero_copy();
    d["multi_buffer"] = x && x->socket().multi_buffer();
    return d;
  }
  std::map<std::string, uint64_t> ProgramCounters() { return program_->Counters(); }
  void Close() {
    py::gil_scoped_release nogil;
    ports_.clear();
    program_.reset();
  }

 private:
  std::vector<std::unique_ptr<Transport>> ports_;
  std::shared_ptr<xdp::XdpProgram> program_;
  std::vector<std::string> notes_;
};
#endif

}  // namespace

void BindXdp(py::module_& m, PyObject* engine_error, PyObject* refused_error) {
#ifdef NETREDUCE_HAVE_XDP
  g_xdp_error = engine_error;
  g_xdp_refused = refused_error;
  m.attr("HAVE_XDP") = true;
  py::class_<XdpPorts>(m, "XdpPorts")
      .def(py::init<const std::string&, uint16_t, const std::string&, uint32_t,
                    const std::string&, bool>(),
           py::arg("host"), py::arg("port"), py::arg("device") = "", py::arg("threads") = 1,
           py::arg("mode") = "auto", py::arg("zero_copy") = true)
      .def("describe", &XdpPorts::Describe)
      .def("port", &XdpPorts::Port, py::arg("index") = 0)
      .def("send", &XdpPorts::Send, py::arg("index"), py::arg("dst"), py::arg("dst_port"),
           py::arg("data"), py::arg("src") = "")
      .def("recv", &XdpPorts::Recv, py::arg("index") = 0, py::arg("timeout_ms") = 1000.0,
           py::arg("max") = 64)
      .def("stats", &XdpPorts::Stats, py::arg("index") = 0)
      .def("info", &XdpPorts::Info)
      .def("program_counters", &XdpPorts::ProgramCounters)
      .def("close", &XdpPorts::Close);
#else
  m.attr("HAVE_XDP") = false;
  (void)engine_error;
  (void)refused_error;
#endif
}
