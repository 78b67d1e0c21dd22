// The slot arithmetic alone (native/reduce/kernels.cc), as the aggregator runs it: a
// receive batch of ~512 KiB of contributions (payload bytes each) folded into the
// slots of a job (first contribution copied in, the others combined), each slot
// finished once all `ranks` have come. Prints one JSON line per dtype x op: the CPU
// time (this thread's) per GB of contributions. Built and run by benchmarks/kernels.py,
// which compiles it against two versions of kernels.cc and alternates them.
//
//   kernels_bench PAYLOAD_BYTES RANKS GB [DTYPE,...] [OP,...]
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reduce/dtype.h"

using namespace netreduce;

namespace {

double ThreadCpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

std::vector<std::string> Split(const char* s) {
  std::vector<std::string> out;
  std::string cur;
  for (; *s; ++s) {
    if (*s == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += *s;
    }
  }
  out.push_back(cur);
  return out;
}

// Plausible gradients in the wire type: small normals, no NaN (the kernels have no
// data-dependent branches; tests/unit/test_kernels.py covers NaN and zeros).
void Fill(DType d, std::vector<uint8_t>* buf, std::mt19937* rng) {
  std::normal_distribution<float> g(0.0f, 1e-2f);
  const size_t es = ElementSize(d);
  for (size_t i = 0; i + es <= buf->size(); i += es) {
    const float f = g(*rng);
    uint8_t* p = buf->data() + i;
    switch (d) {
      case DType::kF32: std::memcpy(p, &f, 4); break;
      case DType::kF64: { const double v = f; std::memcpy(p, &v, 8); break; }
      case DType::kI32: { const int32_t v = int32_t(f * 1e6f); std::memcpy(p, &v, 4); break; }
      case DType::kI64: { const int64_t v = int64_t(f * 1e6f); std::memcpy(p, &v, 8); break; }
      default: {  // 16-bit floats: the top half of a float32 is a bfloat16; for float16
        uint32_t bits;  // a small normal's upper bits suffice as plausible data
        std::memcpy(&bits, &f, 4);
        const uint16_t h = d == DType::kBF16 ? uint16_t(bits >> 16)
                                             : uint16_t(0x2000 | ((bits >> 13) & 0x1FFF));
        std::memcpy(p, &h, 2);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s PAYLOAD_BYTES RANKS GB [DTYPES] [OPS]\n", argv[0]);
    return 2;
  }
  const size_t payload = std::strtoul(argv[1], nullptr, 10);
  const unsigned ranks = unsigned(std::strtoul(argv[2], nullptr, 10));
  const double gb = std::strtod(argv[3], nullptr);
  const auto dtypes = Split(argc > 4 ? argv[4] : "float32,float64,float16,bfloat16,int32,int64");
  const auto ops = Split(argc > 5 ? argv[5] : "sum,min,max");
  const char* kDtypes[] = {"float32", "float64", "float16", "bfloat16", "int32", "int64"};
  const char* kOps[] = {"sum", "min", "max", "product"};
  std::mt19937 rng(7);
  // A batch of contributions (~512 KiB, as the aggregator receives them) and the job's
  // slots: 2 MiB in flight, as admission grants (SlotsFor).
  const size_t batch = std::max<size_t>(ranks, (512 * 1024) / payload / ranks * ranks);
  const size_t slots = std::max<size_t>(1, (2u << 20) / payload);
  for (const std::string& dn : dtypes) {
    int di = -1;
    for (int i = 0; i < 6; ++i) di = dn == kDtypes[i] ? i : di;
    if (di < 0) return std::fprintf(stderr, "unknown dtype %s\n", dn.c_str()), 2;
    const DType d = DType(di);
    const size_t n = payload / AccumSize(d);  // elements per chunk, as the engine cuts
    const size_t in_bytes = n * ElementSize(d);
    std::vector<uint8_t> in(batch * in_bytes);
    Fill(d, &in, &rng);
    std::vector<uint8_t> acc(slots * payload + 64);
    for (const std::string& on : ops) {
      int oi = -1;
      for (int i = 0; i < 4; ++i) oi = on == kOps[i] ? i : oi;
      if (oi < 0) return std::fprintf(stderr, "unknown op %s\n", on.c_str()), 2;
      const Op op = Op(oi);
      const size_t total = size_t(gb * 1e9);
      size_t done = 0, slot = 0;
      const double t0 = ThreadCpu();
      while (done < total) {
        for (size_t b = 0; b < batch; b += ranks) {  // one slot's round per `ranks` packets
          uint8_t* a = acc.data() + slot * payload;
          for (unsigned r = 0; r < ranks; ++r) {
            Accumulate(d, op, a, in.data() + (b + r) * in_bytes, n, r == 0);
          }
          Finish(d, a, n);
          slot = (slot + 1) % slots;
          done += size_t(ranks) * in_bytes;
        }
      }
      const double cpu = ThreadCpu() - t0;
      volatile uint8_t sink = acc[payload / 2];
      (void)sink;
      std::printf("{\"simd\": \"%s\", \"dtype\": \"%s\", \"op\": \"%s\", \"payload\": %zu, "
                  "\"ranks\": %u, \"bytes\": %zu, \"cpu_s\": %.6f, \"cpu_s_per_gb\": %.5f}\n",
                  SimdPath(), dn.c_str(), on.c_str(), payload, ranks, done, cpu,
                  cpu / (double(done) / 1e9));
      std::fflush(stdout);
    }
  }
  return 0;
}
