// A native data-plane test for the sanitizer build (scripts/sanitizers.sh): a real
// Aggregator on loopback (two data threads) and three Engines, one per rank, all in
// this process, all-reducing every dtype x op at RoCE-sized (ICRC-checked) and jumbo
// payloads, sizes across chunk boundaries, with the engine's drop knob on so that
// retransmission, duplicate and stored-result paths run too. Integer-valued inputs,
// so every result is exact: any mismatch, leak, overflow or race report fails it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/aggregator.h"
#include "engine/engine.h"
#include "reduce/dtype.h"

using namespace netreduce;

namespace {

int failures = 0;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

template <typename T>
double Value(const T& v) { return double(v); }

// float16 / bfloat16 as raw 16-bit patterns of small integers.
uint16_t ToF16(int v) {
  if (v == 0) return 0;
  const bool neg = v < 0;
  unsigned a = unsigned(neg ? -v : v), e = 0;
  while ((a >> e) > 1) ++e;
  const unsigned mant = ((a << 10) >> e) & 0x3FF;
  return uint16_t((neg ? 0x8000 : 0) | ((e + 15) << 10) | mant);
}
uint16_t ToBf16(int v) {
  float f = float(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

void Fill(DType dt, int rank, size_t n, std::vector<uint8_t>* buf) {
  buf->assign(n * ElementSize(dt), 0);
  for (size_t i = 0; i < n; ++i) {
    const int v = int((i * 7 + rank * 13) % 61) - 30;  // small integers, exact in every dtype
    uint8_t* p = buf->data() + i * ElementSize(dt);
    switch (dt) {
      case DType::kF32: { float f = float(v); std::memcpy(p, &f, 4); break; }
      case DType::kF64: { double d = v; std::memcpy(p, &d, 8); break; }
      case DType::kI32: { int32_t x = v; std::memcpy(p, &x, 4); break; }
      case DType::kI64: { int64_t x = v; std::memcpy(p, &x, 8); break; }
      case DType::kF16: { uint16_t x = ToF16(v); std::memcpy(p, &x, 2); break; }
      case DType::kBF16: { uint16_t x = ToBf16(v); std::memcpy(p, &x, 2); break; }
    }
  }
}

int Expected(Op op, size_t i, int ranks) {
  int acc = 0;
  for (int r = 0; r < ranks; ++r) {
    const int v = int((i * 7 + r * 13) % 61) - 30;
    if (r == 0) acc = v;
    else if (op == Op::kSum) acc += v;
    else if (op == Op::kMin) acc = std::min(acc, v);
    else acc = std::max(acc, v);
  }
  return acc;
}

void Run(uint32_t payload, uint32_t threads, double drop) {
  AggregatorConfig ac;
  ac.host = "127.0.0.1";
  ac.port = 0;
  ac.slots = 8;
  ac.payload_bytes = payload;
  ac.threads = threads;
  ac.memory_limit = 64 << 20;
  Aggregator agg(ac);
  Status st = agg.Start();
  Check(st.ok(), "aggregator start: " + st.message());
  if (!st.ok()) return;
  const int kRanks = 3;
  uint32_t index = 0;
  st = agg.AddJob(kRanks, 0xC0FFEE, &index, payload);
  Check(st.ok(), "admission: " + st.message());
  for (int r = 0; r < kRanks; ++r) {  // the engines' sockets: 127.0.0.1, ports of their own
    st = agg.BindRank(index, uint32_t(r), IpAddr::V4(htonl(0x7f000001)), 0, 0);
    Check(st.ok(), "binding: " + st.message());
  }
  std::vector<std::unique_ptr<Engine>> engines(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    EngineConfig ec;
    ec.host = "127.0.0.1";
    ec.port = agg.port();
    ec.threads = threads;
    ec.job = "selftest";
    ec.job_index = index;
    ec.rank = uint32_t(r);
    ec.size = kRanks;
    ec.key = 0xC0FFEE;
    ec.slots = ac.slots;
    ec.payload_bytes = payload;
    ec.retransmit_ms = 2.0;
    ec.timeout_s = 20.0;
    ec.drop_rate = drop;
    ec.seed = uint64_t(r) + 1;
    st = Engine::Create(ec, &engines[r]);
    Check(st.ok(), "engine start: " + st.message());
    if (!st.ok()) return;
  }
  const DType dts[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kI64};
  const Op ops[] = {Op::kSum, Op::kMin, Op::kMax};
  const size_t sizes[] = {1, 3, 1000, 40000};
  for (DType dt : dts) {
    for (Op op : ops) {
      for (size_t n : sizes) {
        std::vector<std::vector<uint8_t>> bufs(kRanks);
        std::vector<std::shared_ptr<Engine::Request>> reqs(kRanks);
        for (int r = 0; r < kRanks; ++r) {
          Fill(dt, r, n, &bufs[r]);
          reqs[r] = engines[r]->Submit(bufs[r].data(), bufs[r].data(), n, dt, op);
        }
        for (int r = 0; r < kRanks; ++r) {
          Status w = Engine::Wait(*reqs[r]);
          Check(w.ok(), std::string("all-reduce ") + DTypeName(dt) + " " + OpName(op) + ": " + w.message());
        }
        std::vector<uint8_t> want;
        want.resize(n * ElementSize(dt));
        for (size_t i = 0; i < n; ++i) {
          const int v = Expected(op, i, kRanks);
          std::vector<uint8_t> one;
          // Fill() with a single value: reuse its encoding through a 1-element buffer.
          uint8_t* p = want.data() + i * ElementSize(dt);
          switch (dt) {
            case DType::kF32: { float f = float(v); std::memcpy(p, &f, 4); break; }
            case DType::kF64: { double d = v; std::memcpy(p, &d, 8); break; }
            case DType::kI32: { int32_t x = v; std::memcpy(p, &x, 4); break; }
            case DType::kI64: { int64_t x = v; std::memcpy(p, &x, 8); break; }
            case DType::kF16: { uint16_t x = ToF16(v); std::memcpy(p, &x, 2); break; }
            case DType::kBF16: { uint16_t x = ToBf16(v); std::memcpy(p, &x, 2); break; }
          }
        }
        for (int r = 0; r < kRanks; ++r) {
          Check(bufs[r] == want, std::string("result of ") + DTypeName(dt) + " " + OpName(op) +
                                     " n=" + std::to_string(n) + " rank " + std::to_string(r));
        }
      }
    }
  }
  std::map<std::string, uint64_t> c;
  agg.JobCounters(index, &c);
  std::printf("payload %u threads %u drop %.2f: %llu slots completed, %llu duplicates, %llu drops\n",
              payload, threads, drop, (unsigned long long)c["slots_completed"],
              (unsigned long long)c["duplicates"], (unsigned long long)c["drops"]);
  engines.clear();
  Check(agg.RemoveJob(index).ok(), "remove job");
  agg.Stop();
}

}  // namespace

int main() {
  Run(4096, 2, 0.0);   // RoCE-sized packets, ICRC computed and verified
  Run(65464, 1, 0.0);  // software jumbo payloads
  Run(1024, 2, 0.05);  // 5 % loss: retransmissions, duplicates, stored results
  if (failures) {
    std::fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  std::printf("dataplane selftest passed\n");
  return 0;
}
