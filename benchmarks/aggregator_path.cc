// The aggregator's per-packet path alone (Aggregator::HandleDatagram and the result
// packets it builds), timed by the thread's CPU clock: no kernel, no ranks, no other
// process in the measured time, so that a change to that path can be compared on a
// busy machine (the whole-daemon cost is benchmarks/linerate.py cost).
//
// One job of N ranks at payload P (the slots the daemon gives it: 2 MiB in flight),
// --fanout segment with every rank seeing the group (one result packet per slot), a
// message of S bytes of float32 sent as the ranks' engines do: chunk c goes to slot
// c % W, shadow (c / W) % 2, PSN c, where W is the window (the K slots unless one is
// given). Contributions arrive in runs of 44 datagrams (one GSO send, one GRO receive)
// per rank, rank r `r x lag` chunks behind rank 0 (lag one run unless given; a rank
// leads the last by less than W, as the window allows), in receive batches of ~512 KiB
// written into the same buffers each time, as the kernel does, each batch handled as
// one receive (Aggregator::HandleReceive, where the tree has it). The ranks' lag is what
// decides whether a slot's accumulator is still in L2 when its next contribution comes.
// Built and run by benchmarks/aggregator_path.py against any checkout.
//
//   aggregator_path N P BYTES REPEATS [WINDOW [LAG_CHUNKS | Fw]]   (Fw: rank 0 leads the
//   last rank by F of the window)
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "aggregator/aggregator.h"
#include "wire/roce.h"

using namespace netreduce;

// A tree whose Aggregator has HandleReceive (one ReceiveState per receive batch, as its
// data loop) is driven through it; an older one datagram by datagram, as its loop did.
template <typename A, typename = void>
struct HasHandleReceive : std::false_type {};
template <typename A>
struct HasHandleReceive<A, std::void_t<decltype(&A::HandleReceive)>> : std::true_type {};

template <typename A>
static void HandleBatch(A& agg, const std::vector<InPacket>& in, size_t m, ResultBatch& out) {
  if constexpr (HasHandleReceive<A>::value) {
    agg.HandleReceive(0, htons(4791), in.data(), m, out);
  } else {
    for (size_t i = 0; i < m; ++i) agg.HandleDatagram(0, htons(4791), in[i], out);
  }
}

static double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const uint32_t n = argc > 1 ? uint32_t(atoi(argv[1])) : 4;
  const uint32_t payload = argc > 2 ? uint32_t(atoi(argv[2])) : 1432;
  const size_t bytes = argc > 3 ? size_t(atoll(argv[3])) : (size_t(64) << 20);
  const int repeats = argc > 4 ? atoi(argv[4]) : 5;
  AggregatorConfig cfg;
  cfg.host = "127.0.0.1";
  cfg.payload_bytes = 65464;  // as benchmarks/linerate.py starts the daemon
  Aggregator agg(cfg);
  const uint32_t key = 0x1234567;
  uint32_t idx = 0;
  if (!agg.AddJob(n, key, &idx, payload).ok()) return 2;
  for (uint32_t r = 0; r < n; ++r) {
    if (!agg.BindRank(idx, r, IpAddr::V4(0x0100007f), uint16_t(0x1000 + r), 1).ok()) return 2;
  }
  if (!agg.SetJobGroup(idx, true).ok()) return 2;
  const uint32_t pool = agg.SlotsFor(payload);
  const uint32_t asked = argc > 5 ? uint32_t(atoi(argv[5])) : 0;
  const uint32_t slots = asked == 0 || asked > pool ? pool : asked;  // the window, as the engine
  const size_t dgram = wire::DatagramBytes(payload);
  const uint32_t run = uint32_t(std::min<size_t>(wire::kMaxGsoSegments, 65507 / dgram));
  // LAG_CHUNKS, or "Fw": rank 0 leads the last rank by F of the window.
  size_t lag = run;
  if (argc > 6 && argv[6][0] != 0 && argv[6][strlen(argv[6]) - 1] == 'w') {
    lag = n > 1 ? size_t(atof(argv[6]) * slots / (n - 1)) : 0;
  } else if (argc > 6) {
    lag = size_t(atoll(argv[6]));
  }
  if (n > 1 && (n - 1) * lag >= slots) lag = (slots - 1) / (n - 1);  // the window's bound
  const size_t per_batch = std::max<size_t>(1, (512 * 1024 / (run * dgram))) * run;
  const size_t chunks = bytes / payload;
  std::vector<uint8_t> mem(per_batch * dgram + 64);
  uint8_t* base = mem.data() + 32;  // payloads on 64 bytes, as the daemon's buffers
  for (size_t i = 0; i < per_batch * dgram; ++i) base[i] = uint8_t(i * 7);
  // The arrival order: (rank, chunk) pairs, runs of `run` chunks per rank; rank r's
  // run starting at chunk c arrives at time c + r x lag (ties: lower rank first).
  std::vector<std::pair<uint32_t, uint32_t>> order;
  std::vector<std::tuple<size_t, uint32_t, size_t>> starts;  // (time, rank, first chunk)
  for (uint32_t r = 0; r < n; ++r) {
    for (size_t first = 0; first < chunks; first += run) starts.emplace_back(first + r * lag, r, first);
  }
  std::sort(starts.begin(), starts.end());
  for (const auto& [t, r, first] : starts) {
    for (size_t c = first; c < std::min(chunks, first + run); ++c) order.emplace_back(r, uint32_t(c));
  }
  ResultBatch out(nullptr);
  std::vector<InPacket> in(per_batch);
  double best = 1e30;
  for (int rep = 0; rep < repeats; ++rep) {
    double spent = 0;
    const uint32_t psn0 = uint32_t(rep) * uint32_t(chunks + 2 * slots);  // new rounds each time
    for (size_t at = 0; at < order.size(); at += per_batch) {
      const size_t m = std::min(per_batch, order.size() - at);
      for (size_t i = 0; i < m; ++i) {  // the "kernel's" copy: headers of this batch
        const auto [r, c] = order[at + i];
        wire::Header h;
        h.dest_qp = wire::MakeQpn(idx, r);
        h.psn = (psn0 + c) & 0xFFFFFF;
        h.slot = uint16_t(c % slots);
        h.shadow = uint8_t((c / slots) % 2);
        h.offset = uint64_t(c) * (payload / 4);
        h.key = key;
        h.length = payload;
        h.jumbo = payload > wire::kRoceMaxPayload;  // as the engine's (engine_open.cc)
        h.msg_id = 7 + uint32_t(rep);
        h.udp_checksum = true;
        h.group_seen = true;
        uint8_t* p = base + i * dgram;
        wire::Encode(h, p);
        InPacket& pkt = in[i];
        pkt.buf = p;
        pkt.cap = pkt.len = dgram;
        pkt.from = Endpoint{0x0100007f, htons(uint16_t(0x1000 + r))};
        pkt.local_ip = 0x0100007f;
        pkt.kernel_checked = true;
      }
      const double t0 = ThreadSeconds();
      HandleBatch(agg, in, m, out);
      out.Flush();
      spent += ThreadSeconds() - t0;
    }
    best = std::min(best, spent);
    std::map<std::string, uint64_t> c;
    agg.JobCounters(idx, &c);
    fprintf(stderr, "  repeat %d: %.1f ns per contribution (%zu), %.3f GB of input per CPU-s; "
            "slots completed %lu, drops %lu\n", rep, spent * 1e9 / order.size(), order.size(),
            double(order.size()) * payload / 1e9 / spent, (unsigned long)c["slots_completed"],
            (unsigned long)(c["packets_in"] - c["bytes_reduced"] / payload));
  }
  printf("{\"ns_per_contribution\": %.2f, \"GB_per_cpu_s\": %.4f, \"contributions\": %zu, "
         "\"payload\": %u, \"ranks\": %u, \"slots\": %u, \"window\": %u, \"lag_chunks\": %zu}\n",
         best * 1e9 / order.size(), double(order.size()) * payload / 1e9 / best, order.size(),
         payload, n, pool, slots, lag);
  return 0;
}
