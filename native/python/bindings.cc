// netreduce._native: the one pybind11 module. Buffers cross by the buffer protocol
// (zero copies); every wait releases the GIL; native Status becomes a Python
// exception here and nowhere else.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <functional>
#include <memory>
#include <tuple>

#include "aggregator/aggregator.h"
#include "aggregator/path_payload.h"
#include "engine/engine.h"
#include "reduce/dtype.h"
#include "transport/udp/sockaddr.h"
#include "wire/roce.h"
#ifdef NETREDUCE_HAVE_XDP
#include "transport/xdp/xdp_transport.h"
#endif

namespace py = pybind11;
using namespace netreduce;

namespace {

PyObject* g_error = nullptr;          // EngineError(RuntimeError)
PyObject* g_timeout = nullptr;        // TimeoutError(EngineError)
PyObject* g_aborted = nullptr;        // AbortedError(EngineError)
PyObject* g_refused = nullptr;        // RefusedError(EngineError)

}  // namespace

// A Status as the module's exception (ValueError for bad arguments); also called by
// receive_script_bindings.cc.
void Throw(const Status& st) {
  switch (st.code()) {
    case Code::kOk: return;
    case Code::kInvalidArgument: throw py::value_error(st.message());
    case Code::kTimeout: PyErr_SetString(g_timeout, st.message().c_str()); break;
    case Code::kAborted: PyErr_SetString(g_aborted, st.message().c_str()); break;
    case Code::kRefused: PyErr_SetString(g_refused, st.message().c_str()); break;
    default: PyErr_SetString(g_error, st.message().c_str()); break;
  }
  throw py::error_already_set();
}

namespace {

// NETREDUCE_ICRC_CHECK: "auto" trusts a kernel-verified UDP checksum (wire::IcrcCheckNeeded),
// "always" computes every received ICRC.
bool TrustUdpChecksum(const std::string& icrc_check) {
  if (icrc_check == "auto") return true;
  if (icrc_check == "always") return false;
  throw py::value_error("NETREDUCE_ICRC_CHECK must be 'auto' or 'always', not '" + icrc_check + "'");
}
const char* IcrcCheckName(bool trust_udp_checksum) { return trust_udp_checksum ? "auto" : "always"; }

// Defaults: each is declared once. A setting the Python side declares -- a knob in
// netreduce/config.py (udp_offload, icrc_check, the engine's window, retransmit_ms,
// timeout_s, drop_rate) or a netreduce-switch flag (netreduce/switch/settings.py) --
// has no default here: callers pass it. The rest take theirs from the native configs
// (engine.h). AGGREGATOR_DEFAULTS and ENGINE_DEFAULTS export the native configs'
// defaults (what C++ callers get) so that tests/unit/test_native_surface.py can check
// them, the .pyi and the Python tables against each other.
const AggregatorConfig kAggregatorDefaults{};
const EngineConfig kEngineDefaults{};

Fanout FanoutOf(const std::string& text) {
  Fanout f = Fanout::kUnicast;
  Throw(ParseFanout(text, &f));
  return f;
}

DType CheckDType(int code) {
  if (!ValidDType(uint8_t(code))) throw py::value_error("unknown dtype code " + std::to_string(code));
  return DType(code);
}
Op CheckOp(int code) {
  if (!ValidOp(uint8_t(code))) throw py::value_error("unknown op code " + std::to_string(code));
  return Op(code);
}

// A buffer view that must be C-contiguous; returns its byte length.
py::buffer_info Contiguous(py::buffer b, bool writable, const char* what) {
  py::buffer_info info = b.request(writable);
  ssize_t expect = info.itemsize;
  for (ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] > 1 && info.strides[i] != expect) {
      throw py::value_error(std::string(what) + " must be C-contiguous");
    }
    expect *= info.shape[i];
  }
  return info;
}

struct PyRequest {
  std::shared_ptr<Engine::Request> req;
  py::object keep_src, keep_dst;  // the buffers stay alive while the engine uses them
  bool Done() const { return Engine::Done(*req); }
  void Wait() {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = Engine::Wait(*req);
    }
    Throw(st);
  }
};

// Engine.submit; its defaults (owner -1, scale 1.0) are the py::arg()s of its .def only.
std::shared_ptr<PyRequest> SubmitBuffers(Engine& e, py::buffer src, py::buffer dst, int dtype, int op,
                                         int owner, double scale) {
  const DType dt = CheckDType(dtype);
  const Op o = CheckOp(op);
  py::buffer_info s = Contiguous(src, false, "source buffer");
  py::buffer_info d = Contiguous(dst, true, "destination buffer");
  const ssize_t sbytes = s.size * s.itemsize;
  const ssize_t dbytes = d.size * d.itemsize;
  if (sbytes != dbytes) {
    throw py::value_error("source (" + std::to_string(sbytes) + " bytes) and destination (" +
                          std::to_string(dbytes) + " bytes) differ in size");
  }
  const size_t esize = ElementSize(dt);
  if (size_t(sbytes) % esize != 0) {
    throw py::value_error("buffer of " + std::to_string(sbytes) + " bytes is not a whole number of " +
                          DTypeName(dt) + " elements");
  }
  auto r = std::make_shared<PyRequest>();
  r->keep_src = src;
  r->keep_dst = dst;
  r->req = e.Submit(s.ptr, d.ptr, size_t(sbytes) / esize, dt, o, int32_t(owner), scale);
  return r;
}

py::dict HeaderToDict(const wire::Header& h) {
  py::dict d;
  d["opcode"] = h.opcode; d["pad"] = h.pad; d["jumbo"] = h.jumbo; d["dest_qp"] = h.dest_qp;
  d["psn"] = h.psn; d["dtype"] = h.dtype; d["op"] = h.op; d["shadow"] = h.shadow;
  d["result"] = h.result; d["slot"] = h.slot; d["offset"] = h.offset; d["key"] = h.key;
  d["length"] = h.length; d["msg_id"] = h.msg_id; d["repeat_seen"] = h.repeat_seen;
  d["ack_req"] = h.ack_req; d["held"] = h.held; d["udp_checksum"] = h.udp_checksum;
  d["group_seen"] = h.group_seen;
  return d;
}

}  // namespace

void BindHierarchical(py::module_& m);  // hierarchical_bindings.cc
Status VoteStepCall(py::buffer src, py::buffer buf, py::buffer out, double factor, uint32_t ranks,
                    const std::function<Status(void*, size_t, DType)>& allreduce,
                    int* outcome);  // vote_step_bindings.cc
void BindVerbs(py::module_& m);         // verbs_bindings.cc
void BindReceiveScript(py::module_& m);  // receive_script_bindings.cc
void BindXdp(py::module_& m, PyObject* error, PyObject* refused);  // xdp_bindings.cc
std::shared_ptr<Transport> TransportFromPy(const py::object& obj);  // verbs_bindings.cc

PYBIND11_MODULE(_native, m) {
  m.doc() = "netreduce native data plane: RoCEv2 wire format, aggregator, worker engine";
  static py::exception<std::runtime_error> error(m, "EngineError", PyExc_RuntimeError);
  static py::exception<std::runtime_error> timeout(m, "TimeoutError", error.ptr());
  static py::exception<std::runtime_error> aborted(m, "AbortedError", error.ptr());
  static py::exception<std::runtime_error> refused(m, "RefusedError", error.ptr());
  g_error = error.ptr();
  g_timeout = timeout.ptr();
  g_aborted = aborted.ptr();
  g_refused = refused.ptr();
  BindHierarchical(m);  // ShmSegment, Hierarchical: after the exception classes it uses

  py::dict dtypes, ops;
  for (int i = 0; i < kNumDTypes; ++i) dtypes[DTypeName(DType(i))] = i;
  for (int i = 0; i < kNumOps; ++i) ops[OpName(Op(i))] = i;
  m.attr("DTYPES") = dtypes;
  m.attr("OPS") = ops;
  m.attr("DEFAULT_PORT") = wire::kDefaultPort;
  m.attr("MAX_PAYLOAD") = wire::kMaxPayload;
  m.attr("ROCE_MAX_PAYLOAD") = wire::kRoceMaxPayload;
  m.attr("HEADER_BYTES") = wire::kHeaderBytes;
  m.attr("MAX_RANKS") = wire::kMaxRanks;

  m.def("build_info", [] {
    py::dict d;
    d["simd"] = SimdPath();
    py::list names;
    for (int i = 0; i < kNumDTypes; ++i) names.append(DTypeName(DType(i)));
    d["dtypes"] = names;
    d["ops"] = py::make_tuple("sum", "min", "max", "product");
    py::list transports;
    transports.append("udp");
#ifdef NETREDUCE_HAVE_VERBS
    transports.append("verbs");
#endif
#ifdef NETREDUCE_HAVE_XDP
    transports.append("xdp");
#endif
    d["transports"] = py::tuple(transports);
#ifdef NETREDUCE_HAVE_XDP
    d["xdp"] = "built in: netreduce-switch --transport xdp";
#else
    d["xdp"] = "not built (the AF_XDP transport needs libxdp-dev, libbpf-dev and clang when the "
               "module is built: scripts/install.sh)";
#endif
    d["wire"] = "RoCEv2 (UDP, BTH+RETH+ImmDt, ICRC); jumbo software extension";
#if defined(NETREDUCE_HAVE_ISAL)
    d["crc32"] = "isa-l";
#elif defined(NETREDUCE_HAVE_LIBDEFLATE)
    d["crc32"] = "libdeflate";
#else
    d["crc32"] = "zlib";
#endif
    d["max_payload"] = wire::kMaxPayload;
    d["compiler"] = __VERSION__;
    return d;
  });

  const AggregatorConfig& ad = kAggregatorDefaults;
  py::dict aggregator_defaults;
  aggregator_defaults["host"] = ad.host;
  aggregator_defaults["port"] = ad.port;
  aggregator_defaults["slots"] = ad.slots;
  aggregator_defaults["payload_bytes"] = ad.payload_bytes;
  aggregator_defaults["max_jobs"] = ad.max_jobs;
  aggregator_defaults["threads"] = ad.threads;
  aggregator_defaults["memory_limit"] = ad.memory_limit;
  aggregator_defaults["fanout"] = FanoutName(ad.fanout);
  aggregator_defaults["group_base"] = ad.group_base;
  aggregator_defaults["transport"] = ad.transport;
  aggregator_defaults["xdp_device"] = ad.xdp_device;
  aggregator_defaults["xdp_mode"] = ad.xdp_mode;
  aggregator_defaults["xdp_fallback"] = ad.xdp_fallback;
  aggregator_defaults["data_nice"] = ad.data_nice;
  aggregator_defaults["udp_offload"] = UdpOffloadName(ad.udp_offload);      // for C++ callers;
  aggregator_defaults["icrc_check"] = IcrcCheckName(ad.trust_udp_checksum);  // Python passes them
  m.attr("AGGREGATOR_DEFAULTS") = aggregator_defaults;

  py::class_<Aggregator>(m, "Aggregator")
      .def(py::init([](const std::string& host, uint16_t port, const std::string& udp_offload,
                       const std::string& icrc_check, uint32_t slots, uint32_t payload_bytes,
                       uint32_t max_jobs, uint32_t threads, uint64_t memory_limit,
                       const std::string& fanout, const std::string& group_base,
                       const std::string& transport, const std::string& xdp_device,
                       const std::string& xdp_mode, bool xdp_fallback, int data_nice) {
             AggregatorConfig c;
             c.host = host; c.port = port; c.slots = slots; c.payload_bytes = payload_bytes;
             c.max_jobs = max_jobs; c.threads = threads; c.memory_limit = memory_limit;
             c.fanout = FanoutOf(fanout);
             c.group_base = group_base;
             Throw(ParseUdpOffload(udp_offload, &c.udp_offload));
             c.transport = transport; c.xdp_device = xdp_device; c.xdp_mode = xdp_mode;
             c.xdp_fallback = xdp_fallback;
             c.data_nice = data_nice;
             c.trust_udp_checksum = TrustUdpChecksum(icrc_check);
             return std::make_unique<Aggregator>(c);
           }),
           // Every setting is the Python side's (netreduce/switch/settings.py: the daemon's
           // flags, aggregator_args()), so none has a default here.
           py::arg("host"), py::arg("port"), py::kw_only(), py::arg("udp_offload"),
           py::arg("icrc_check"), py::arg("slots"), py::arg("payload_bytes"),
           py::arg("max_jobs"), py::arg("threads"), py::arg("memory_limit"), py::arg("fanout"),
           py::arg("group_base"), py::arg("transport"), py::arg("xdp_device"),
           py::arg("xdp_mode"), py::arg("xdp_fallback"), py::arg("data_nice"))
      .def("start", [](Aggregator& a) { Throw(a.Start()); })
      .def("stop", [](Aggregator& a) { py::gil_scoped_release nogil; a.Stop(); })
      .def_property_readonly("port", &Aggregator::port)
      .def_property_readonly("slots", [](Aggregator& a) { return a.config().slots; })
      .def_property_readonly("payload_bytes", [](Aggregator& a) { return a.config().payload_bytes; })
      .def_property_readonly("threads", [](Aggregator& a) { return a.config().threads; })
      .def_property_readonly("data_nice", &Aggregator::data_nice)
      .def_property_readonly("fanout", [](Aggregator& a) { return FanoutName(a.config().fanout); })
      .def_property_readonly("data_path", &Aggregator::DataPath)
      .def("add_job", [](Aggregator& a, uint32_t size, uint32_t key, uint32_t payload_bytes) {
             uint32_t index = 0;
             Throw(a.AddJob(size, key, &index, payload_bytes));
             return index;
           }, py::arg("size"), py::arg("key"), py::arg("payload_bytes") = 0)
      .def("set_job_payload", [](Aggregator& a, uint32_t index, uint32_t payload_bytes) {
             Throw(a.SetJobPayload(index, payload_bytes));
           }, py::arg("index"), py::arg("payload_bytes"))
      .def("remove_job", [](Aggregator& a, uint32_t index) { Throw(a.RemoveJob(index)); },
           py::arg("index"))
      // The data address (job, rank) registered: its contributions come only from `host`,
      // UDP ports port..port+span-1 (span 0: any port, a verbs rank's).
      .def("bind_rank", [](Aggregator& a, uint32_t index, uint32_t rank, const std::string& host,
                           uint16_t port, uint16_t span) {
             IpAddr ip;
             Throw(ResolveHost(host, &ip));
             Throw(a.BindRank(index, rank, ip, port, span));
           }, py::arg("index"), py::arg("rank"), py::arg("host"), py::arg("port"),
           py::arg("span") = 1)
      .def("rank_source", &Aggregator::RankSource, py::arg("index"), py::arg("rank"))
      // Two levels (native/aggregator/uplink.h): members, and on a rack the uplink.
      .def("set_job_tree", [](Aggregator& a, uint32_t index, const std::vector<uint32_t>& members,
                              py::object uplink) {
             if (uplink.is_none()) return Throw(a.SetJobTree(index, members, nullptr));
             py::dict d = uplink.cast<py::dict>();
             UplinkConfig u;
             Throw(ResolveIpv4(d["spine_host"].cast<std::string>(), &u.spine_ip));
             Throw(ResolveIpv4(d["local_host"].cast<std::string>(), &u.local_ip));
             u.spine_port = d["spine_port"].cast<uint16_t>();
             u.spine_threads = d["spine_threads"].cast<uint32_t>();
             u.job_index = d["job_index"].cast<uint32_t>();
             u.rank = d["rank"].cast<uint32_t>();
             u.key = d["key"].cast<uint32_t>();
             u.rto_floor_us = d["rto_floor_us"].cast<uint32_t>();
             u.drop_rate = d["drop_rate"].cast<double>();
             u.drop_results = d["drop_results"].cast<uint32_t>();
             Throw(a.SetJobTree(index, members, &u));
           }, py::arg("index"), py::arg("members"), py::arg("uplink") = py::none())
      .def("set_job_ordered", [](Aggregator& a, uint32_t index) { Throw(a.SetJobOrdered(index)); },
           py::arg("index"))  // NETREDUCE_DETERMINISTIC (aggregator/ordered_slot.h)
      .def("group", &Aggregator::Group, py::arg("index"))
      .def("set_job_group", [](Aggregator& a, uint32_t index, bool on) { Throw(a.SetJobGroup(index, on)); },
           py::arg("index"), py::arg("on"))  // --fanout segment (netreduce/switch/fanout.py)
      // What carries the data ports: transport ("udp" | "xdp"), ports (per port, in
      // words), notes (ports of an xdp setup left on sockets), fallback (why xdp was
      // asked for and not given); with xdp also device, mode and the program's id.
      .def("transport_info", [](Aggregator& a) {
             const DataPortsInfo& p = a.data_ports();
             py::dict d;
             d["transport"] = p.transport;
             d["ports"] = p.describe;
             d["notes"] = p.notes;
             d["fallback"] = p.fallback;
             // The smallest data socket's SO_RCVBUF as read back (the kernel's
             // accounting: twice the bytes set); 0 when no port queues in a socket.
             size_t rcvbuf = 0;
             for (const auto& t : a.data_transports()) {
               const size_t b = t->ReceiveBufferBytes();
               if (b != 0 && (rcvbuf == 0 || b < rcvbuf)) rcvbuf = b;
             }
             d["receive_buffer_bytes"] = rcvbuf;
             d["receive_buffer_asked"] = size_t(Aggregator::kReceiveBufferAsked);
#ifdef NETREDUCE_HAVE_XDP
             if (p.program) {
               d["device"] = p.program->device().name;
               d["mode"] = p.program->mode();
               d["program_id"] = p.program->program_id();
             }
#endif
             return d;
           })
      // Per data port, its transport's packet counts by path (AF_XDP ports: rx_xsk,
      // tx_xsk, tx_kernel_*...; sockets: none), and the XDP program's counters.
      .def("transport_stats", [](Aggregator& a) {
             py::dict d;
             py::list ports;
             for (const auto& t : a.data_transports()) {
#ifdef NETREDUCE_HAVE_XDP
               if (auto* x = dynamic_cast<XdpTransport*>(t.get())) {
                 ports.append(x->Stats());
                 continue;
               }
#endif
               (void)t;
               ports.append(py::dict());
             }
             d["ports"] = ports;
#ifdef NETREDUCE_HAVE_XDP
             if (a.data_ports().program) d["program"] = a.data_ports().program->Counters();
#endif
             return d;
           })
      .def("counters", &Aggregator::GlobalCounters)
      .def("job_counters", [](Aggregator& a, uint32_t index) {
             std::map<std::string, uint64_t> out;
             Throw(a.JobCounters(index, &out));
             return out;
           }, py::arg("index"));

  // Path MTU and the payload it carries (docs/protocol.md, "Payload size").
  m.def("path_mtu", [](const std::string& host, uint16_t port) {
    int mtu = 0;
    bool ipv6 = false;
    Throw(PathMtu(host, port, &mtu, &ipv6));
    return py::make_tuple(mtu, ipv6);
  }, py::arg("host"), py::arg("port") = wire::kDefaultPort);
  m.def("payload_for_mtu", &PayloadForMtu, py::arg("mtu"), py::arg("ipv6") = false);

  py::class_<PyRequest, std::shared_ptr<PyRequest>>(m, "Request")
      .def("done", &PyRequest::Done)
      .def("wait", &PyRequest::Wait);

  const EngineConfig& ed = kEngineDefaults;
  py::dict engine_defaults;  // the C++ defaults of the knobs' fields: config.py's, checked
  engine_defaults["window"] = ed.window;
  engine_defaults["retransmit_ms"] = ed.retransmit_ms;
  engine_defaults["timeout_s"] = ed.timeout_s;
  engine_defaults["drop_rate"] = ed.drop_rate;
  engine_defaults["udp_offload"] = UdpOffloadName(ed.udp_offload);
  engine_defaults["icrc_check"] = IcrcCheckName(ed.trust_udp_checksum);
  engine_defaults["seed"] = ed.seed;
  engine_defaults["group"] = ed.group;
  engine_defaults["group_port"] = ed.group_port;
  engine_defaults["fanout"] = FanoutName(ed.fanout);
  engine_defaults["data_fd"] = ed.data_fd;
  m.attr("ENGINE_DEFAULTS") = engine_defaults;

  py::class_<Engine>(m, "Engine")
      .def(py::init([](const std::string& host, uint16_t port, uint32_t threads, const std::string& job,
                       uint32_t job_index, uint32_t rank, uint32_t size, uint32_t key, uint32_t slots,
                       uint32_t payload_bytes, uint32_t window, double retransmit_ms, double timeout_s,
                       double drop_rate, const std::string& udp_offload,
                       const std::string& icrc_check, uint64_t seed, const std::string& group,
                       uint16_t group_port, const std::string& fanout, py::object transport,
                       int data_fd) {
             EngineConfig c;
             c.data_fd = data_fd;  // ours: closed here or by Create, whatever happens
             c.host = host; c.port = port; c.threads = threads; c.job = job; c.job_index = job_index;
             c.rank = rank; c.size = size; c.key = key; c.slots = slots; c.payload_bytes = payload_bytes;
             c.window = window; c.retransmit_ms = retransmit_ms; c.timeout_s = timeout_s;
             c.drop_rate = drop_rate; c.seed = seed; c.group = group; c.group_port = group_port;
             try {
               c.fanout = FanoutOf(fanout);
               c.transport = TransportFromPy(transport);
               Throw(ParseUdpOffload(udp_offload, &c.udp_offload));
               c.trust_udp_checksum = TrustUdpChecksum(icrc_check);
             } catch (...) {
               if (data_fd >= 0) close(data_fd);
               throw;
             }
             std::unique_ptr<Engine> e;
             Throw(Engine::Create(c, &e));
             return e;
           }),
           py::arg("host"), py::arg("port"), py::arg("threads"), py::arg("job"), py::arg("job_index"),
           py::arg("rank"), py::arg("size"), py::arg("key"), py::arg("slots"), py::arg("payload_bytes"),
           py::kw_only(),  // the knobs' settings (connect_settings, dataplane.py): no defaults
           py::arg("window"), py::arg("retransmit_ms"), py::arg("timeout_s"), py::arg("drop_rate"),
           py::arg("udp_offload"), py::arg("icrc_check"),
           py::arg("seed") = ed.seed, py::arg("group") = ed.group,
           py::arg("group_port") = ed.group_port, py::arg("fanout") = FanoutName(ed.fanout),
           py::arg("transport") = py::none(), py::arg("data_fd") = ed.data_fd)
      .def("submit", &SubmitBuffers, py::arg("src"), py::arg("dst"), py::arg("dtype"), py::arg("op"),
           py::arg("owner") = -1, py::arg("scale") = 1.0)
      .def("allreduce", [](Engine& e, py::buffer src, py::buffer dst, int dtype, int op) {
             SubmitBuffers(e, src, dst, dtype, op, -1, 1.0)->Wait();
           }, py::arg("src"), py::arg("dst"), py::arg("dtype"), py::arg("op"))
      // Speculation.run_lone's message in one call (native/algorithms/vote_step.h)
      .def("vote_step", [](Engine& e, py::buffer src, py::buffer buf, py::buffer out, double factor,
                           uint32_t ranks) {
             int outcome = 0;
             Throw(VoteStepCall(src, buf, out, factor, ranks, [&e](void* b, size_t n, DType dt) {
               return Engine::Wait(*e.Submit(b, b, n, dt, Op::kSum));
             }, &outcome));
             return outcome;
           }, py::arg("src"), py::arg("buf"), py::arg("out"), py::arg("factor"), py::arg("ranks"))
      .def("abort", &Engine::Abort, py::arg("reason"))
      .def("stats", &Engine::Stats)
      .def_property_readonly("aggregator_address", &Engine::AggregatorAddress)
      .def_property_readonly("data_path", &Engine::DataPath)
      .def_property_readonly("receive_buffer_bytes", &Engine::ReceiveBufferBytes)
      .def_property_readonly("group_note", &Engine::GroupNote);
  m.attr("engine_receive_buffer_asked") = UdpOptions().rcvbuf_bytes;

  // A data socket of this host with `udp_offload`, as a rank opens one (a probe socket
  // on 127.0.0.1: the kernel's support; a device may still refuse GSO at send time).
  auto probe_socket = [](const std::string& udp_offload) {
    DataTransportOptions o;
    o.udp.host = "127.0.0.1";
    Throw(ParseUdpOffload(udp_offload, &o.offload));
    std::unique_ptr<Transport> t;
    Throw(MakeDataTransport(o, &t));
    return t;
  };
  // Its packet path.
  m.def("udp_data_path", [probe_socket](const std::string& udp_offload) {
    return probe_socket(udp_offload)->Describe();
  }, py::arg("udp_offload"));  // NETREDUCE_UDP_OFFLOAD: the caller passes it
  // What it gets for received datagrams: SO_RCVBUF read back (twice the bytes; the
  // kernel caps the ask at net.core.rmem_max without CAP_NET_ADMIN) and whether it
  // coalesces them (UDP_GRO under `udp_offload`).
  m.def("udp_receive_buffer", [probe_socket](const std::string& udp_offload) {
    const std::unique_ptr<Transport> t = probe_socket(udp_offload);
    const auto* udp = dynamic_cast<const UdpTransport*>(t.get());
    return py::make_tuple(t->ReceiveBufferBytes(), udp != nullptr && udp->gro());
  }, py::arg("udp_offload"));  // NETREDUCE_UDP_OFFLOAD: the caller passes it
  // UDP GSO (wire/roce.h): XOR into an ICRC computed for IPv4 ID 0 to get ID `id`'s.
  m.def("icrc_ip_id_delta", &wire::IcrcIpIdDelta, py::arg("datagram_bytes"), py::arg("id"));
  // A RoCEv2 datagram's UDP payload for `payload_bytes`: header, padded payload, ICRC.
  m.def("datagram_bytes", [](size_t payload_bytes) { return wire::DatagramBytes(payload_bytes); },
        py::arg("payload_bytes"));
  // engine/nap.h's NapRest over a scripted run of messages, for tests: each message's
  // verdict ("off": its naps cost rate, "kept", "-": not judged) in turn; whether each
  // message was allowed to nap. A resting message is not judged (it did not nap).
  m.def("nap_rest_script", [](const std::vector<std::string>& verdicts) {
    engine_nap::NapRest rest;
    std::vector<bool> allowed;
    for (const std::string& v : verdicts) {
      const bool may = rest.Start();
      allowed.push_back(may);
      if (may) rest.Judged(v == "off", v == "kept");
    }
    return allowed;
  }, py::arg("verdicts"));
  // engine/nap.h's NapClock over scripted drains, for tests: per (time us, datagrams,
  // outstanding) the drain, then the nap it allows (caught up), taken if not 0.
  m.def("nap_clock_script", [](uint64_t skip, uint64_t coalesced,
                               const std::vector<std::tuple<int64_t, uint64_t, uint64_t>>& drains) {
    engine_nap::NapClock clock(skip, coalesced, true);
    std::vector<int64_t> naps;
    for (const auto& [t, n, outstanding] : drains) {
      clock.Drained(t, n);
      const int64_t nap = clock.NapUs(outstanding, true);
      if (nap > 0) clock.Napping();
      naps.push_back(nap);
    }
    return py::make_tuple(naps, clock.Off());
  }, py::arg("skip"), py::arg("coalesced"), py::arg("drains"));

  // The slot arithmetic alone (reduce/kernels.cc), for tests against numpy: inputs
  // (buffers of `dtype` on the wire) folded in the order given, as a slot folds
  // contributions, on the kernel set `simd` ("auto": dispatch's choice, "generic",
  // "avx2+f16c"); the result in the wire type.
  m.def("reduce_kernel", [](int dtype, int op, const std::vector<py::buffer>& inputs,
                            const std::string& simd) {
    if (!ValidDType(uint8_t(dtype)) || !ValidOp(uint8_t(op)) || inputs.empty()) {
      throw py::value_error("reduce_kernel: a dtype and op code and at least one input");
    }
    const DType d = DType(dtype);
    const std::string path = simd == "auto" ? SimdPath() : simd;
    const size_t bytes = inputs[0].request().size * inputs[0].request().itemsize;
    const size_t n = bytes / ElementSize(d);
    std::vector<uint8_t> acc(n * AccumSize(d) + 64);
    for (size_t i = 0; i < inputs.size(); ++i) {
      py::buffer_info b = inputs[i].request();
      if (size_t(b.size * b.itemsize) != bytes) throw py::value_error("reduce_kernel: inputs differ in size");
      if (!AccumulateOn(path.c_str(), d, Op(op), acc.data(), b.ptr, n, i == 0)) {
        throw py::value_error("reduce_kernel: no kernel set '" + simd + "' here (this CPU: " +
                              SimdPath() + ")");
      }
    }
    FinishOn(path.c_str(), d, acc.data(), n);
    return py::bytes(reinterpret_cast<const char*>(acc.data()), n * ElementSize(d));
  }, py::arg("dtype"), py::arg("op"), py::arg("inputs"), py::arg("simd") = "auto");

  // Wire helpers, for tests and tools that craft or inspect packets.
  m.def("encode_header", [](py::dict f) {
    wire::Header h;
    auto get = [&](const char* k, uint64_t dflt) { return f.contains(k) ? f[k].cast<uint64_t>() : dflt; };
    h.opcode = uint8_t(get("opcode", wire::kOpcodeUcWriteOnlyImm));
    h.jumbo = get("jumbo", 0) != 0;
    h.dest_qp = uint32_t(get("dest_qp", 0)); h.psn = uint32_t(get("psn", 0));
    h.dtype = uint8_t(get("dtype", 0)); h.op = uint8_t(get("op", 0));
    h.shadow = uint8_t(get("shadow", 0)); h.result = get("result", 0) != 0;
    h.slot = uint16_t(get("slot", 0)); h.offset = get("offset", 0); h.key = uint32_t(get("key", 0));
    h.length = uint32_t(get("length", 0)); h.msg_id = uint32_t(get("msg_id", 0));
    h.repeat_seen = get("repeat_seen", 0) != 0;
    h.ack_req = get("ack_req", 0) != 0; h.held = get("held", 0) != 0;
    h.udp_checksum = get("udp_checksum", 0) != 0;
    h.group_seen = get("group_seen", 0) != 0;
    h.pad = uint8_t(get("pad", wire::PaddedLength(h.length) - h.length));
    uint8_t out[wire::kHeaderBytes];
    wire::Encode(h, out);
    return py::bytes(reinterpret_cast<char*>(out), sizeof(out));
  }, py::arg("fields"));
  m.def("decode_header", [](py::bytes pkt) {
    std::string s = pkt;
    wire::Header h;
    wire::DecodeError e = wire::Decode(reinterpret_cast<const uint8_t*>(s.data()), s.size(), &h);
    if (e != wire::DecodeError::kOk) throw py::value_error("bad packet: error " + std::to_string(int(e)));
    return HeaderToDict(h);
  }, py::arg("packet"));
  m.def("compute_icrc", [](uint32_t src_ip_be, uint32_t dst_ip_be, uint16_t src_port_be,
                           uint16_t dst_port_be, py::bytes header, py::bytes payload, uint32_t pad) {
    std::string hd = header, pl = payload;
    return wire::ComputeIcrc(src_ip_be, dst_ip_be, src_port_be, dst_port_be,
                             reinterpret_cast<const uint8_t*>(hd.data()),
                             reinterpret_cast<const uint8_t*>(pl.data()), pl.size(), pad);
  }, py::arg("src_ip_be"), py::arg("dst_ip_be"), py::arg("src_port_be"), py::arg("dst_port_be"),
     py::arg("header"), py::arg("payload"), py::arg("pad"));
  // The same from address text (IPv4 or IPv6 literals) and host-order ports.
  m.def("compute_icrc_for", [](const std::string& src, const std::string& dst, uint16_t src_port,
                               uint16_t dst_port, py::bytes header, py::bytes payload, uint32_t pad,
                               bool shared_payload_crc) {
    IpAddr s_ip, d_ip;
    Throw(ResolveHost(src, &s_ip));
    Throw(ResolveHost(dst, &d_ip));
    std::string hd = header, pl = payload;
    const auto* h = reinterpret_cast<const uint8_t*>(hd.data());
    const auto* p = reinterpret_cast<const uint8_t*>(pl.data());
    if (shared_payload_crc) {  // the aggregator's fan-out: payload CRC first, then combined
      return wire::ComputeIcrcWith(s_ip, d_ip, htons(src_port), htons(dst_port), h, pl.size(), pad,
                                   wire::PayloadCrc(p, pl.size(), pad));
    }
    return wire::ComputeIcrc(s_ip, d_ip, htons(src_port), htons(dst_port), h, p, pl.size(), pad);
  }, py::arg("src"), py::arg("dst"), py::arg("src_port"), py::arg("dst_port"), py::arg("header"),
     py::arg("payload"), py::arg("pad"), py::arg("shared_payload_crc") = false);
  BindVerbs(m);  // after Aggregator: it adds attach_verbs_peer to it
  BindReceiveScript(m);  // and receive_script
  BindXdp(m, g_error, g_refused);
}
