// netreduce._native: the shared-memory segment and the hierarchical all-reduce
// (native/shm, native/algorithms). Kept out of bindings.cc so that file stays the
// engine's and aggregator's; registered from there by BindHierarchical(). Errors map
// to the same exception classes (looked up on the module).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <memory>

#include "algorithms/hierarchical.h"
#include "algorithms/vote_step.h"
#include "engine/engine.h"
#include "shm/segment.h"

namespace py = pybind11;
using namespace netreduce;

namespace {

// The module's exception classes, referenced for the life of the process (never
// released: a static py::object would be destroyed after the interpreter).
PyObject* g_classes[4] = {nullptr, nullptr, nullptr, nullptr};

void ThrowStatus(const Status& st) {
  int cls = 0;
  switch (st.code()) {
    case Code::kOk: return;
    case Code::kInvalidArgument: throw py::value_error(st.message());
    case Code::kTimeout: cls = 1; break;
    case Code::kAborted: cls = 2; break;
    case Code::kRefused: cls = 3; break;
    default: break;
  }
  PyErr_SetString(g_classes[cls], st.message().c_str());
  throw py::error_already_set();
}

struct PySegment {
  std::unique_ptr<shm::Segment> seg;
  shm::Segment& Get() const {
    if (!seg) throw py::value_error("this shared-memory segment was handed to a Hierarchical");
    return *seg;
  }
};

struct PyHierarchical {
  py::object engine_keep;  // declared first: destroyed after `h`, which uses it
  std::unique_ptr<Hierarchical> h;
};

}  // namespace

Status VoteStepCall(py::buffer src, py::buffer buf, py::buffer out, double factor, uint32_t ranks,
                    const std::function<Status(void*, size_t, DType)>& allreduce,
                    int* outcome);  // vote_step_bindings.cc

void BindHierarchical(py::module_& m) {
  const char* names[4] = {"EngineError", "TimeoutError", "AbortedError", "RefusedError"};
  for (int i = 0; i < 4; ++i) g_classes[i] = py::object(m.attr(names[i])).release().ptr();

  py::class_<PySegment>(m, "ShmSegment")
      .def_static("create", [](uint32_t local_size, uint64_t chunk_bytes, uint32_t depth) {
             auto p = std::make_unique<PySegment>();
             ThrowStatus(shm::Segment::Create(local_size, chunk_bytes, depth, &p->seg));
             return p;
           }, py::arg("local_size"), py::arg("chunk_bytes"), py::arg("depth"))
      .def_static("attach", [](int pid, int fd, uint64_t nonce, uint32_t local_rank) {
             auto p = std::make_unique<PySegment>();
             ThrowStatus(shm::Segment::Attach(pid, fd, nonce, local_rank, &p->seg));
             return p;
           }, py::arg("pid"), py::arg("fd"), py::arg("nonce"), py::arg("local_rank"))
      .def_property_readonly("fd", [](const PySegment& s) { return s.Get().fd(); })
      .def_property_readonly("nonce", [](const PySegment& s) { return s.Get().nonce(); })
      .def_property_readonly("size", [](const PySegment& s) { return s.Get().size(); });

  py::class_<PyHierarchical>(m, "Hierarchical")
      .def(py::init([](PySegment& seg, py::object engine, std::vector<int> ranks,
                       const std::string& host, double timeout_s, double spin_us) {
             seg.Get();
             auto p = std::make_unique<PyHierarchical>();
             Engine* e = engine.is_none() ? nullptr : engine.cast<Engine*>();
             p->engine_keep = engine;
             HierarchicalConfig c;
             c.ranks = std::move(ranks);
             c.host = host;
             c.timeout_s = timeout_s;
             c.spin_us = spin_us;
             p->h = std::make_unique<Hierarchical>(std::move(seg.seg), e, std::move(c));
             return p;
           }),
           py::arg("segment"), py::arg("engine"), py::arg("ranks"), py::arg("host"),
           py::arg("timeout_s"),  // NETREDUCE_TIMEOUT: the caller passes it
           py::arg("spin_us") = HierarchicalConfig().spin_us)  // NETREDUCE_SHM_SPIN_US
      .def("start", [](PyHierarchical& p, double attach_timeout_s) {
             Status st;
             {
               py::gil_scoped_release nogil;
               st = p.h->Start(attach_timeout_s);
             }
             ThrowStatus(st);
           }, py::arg("attach_timeout_s"))
      .def("allreduce", [](PyHierarchical& p, py::buffer src, py::buffer dst, int dtype, int op) {
             if (!ValidDType(uint8_t(dtype))) throw py::value_error("unknown dtype code " + std::to_string(dtype));
             if (!ValidOp(uint8_t(op))) throw py::value_error("unknown op code " + std::to_string(op));
             py::buffer_info s = src.request(false), d = dst.request(true);
             const size_t sbytes = size_t(s.size * s.itemsize), dbytes = size_t(d.size * d.itemsize);
             const size_t es = ElementSize(DType(dtype));
             if (sbytes != dbytes || sbytes % es != 0) {
               throw py::value_error("source (" + std::to_string(sbytes) + " B) and destination (" +
                                     std::to_string(dbytes) + " B) must be equal whole numbers of " +
                                     DTypeName(DType(dtype)) + " elements");
             }
             Status st;
             {
               py::gil_scoped_release nogil;
               st = p.h->AllReduce(s.ptr, d.ptr, sbytes / es, DType(dtype), Op(op));
             }
             ThrowStatus(st);
           }, py::arg("src"), py::arg("dst"), py::arg("dtype"), py::arg("op"))
      .def("vote_step", [](PyHierarchical& p, py::buffer src, py::buffer buf, py::buffer out,
                           double factor, uint32_t ranks) {
             int outcome = 0;
             ThrowStatus(VoteStepCall(src, buf, out, factor, ranks, [&p](void* b, size_t n, DType dt) {
               return p.h->AllReduce(b, b, n, dt, Op::kSum);
             }, &outcome));
             return outcome;
           }, py::arg("src"), py::arg("buf"), py::arg("out"), py::arg("factor"), py::arg("ranks"))
      .def("abort", [](PyHierarchical& p, const std::string& reason) { p.h->Abort(reason); },
           py::arg("reason"))
      .def("stats", [](PyHierarchical& p) { return p.h->Stats(); })
      .def_property_readonly("failed_rank", [](PyHierarchical& p) { return p.h->failed_rank(); });
}
