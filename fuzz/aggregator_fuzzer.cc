// libFuzzer harness: the aggregator's per-packet path (Aggregator::HandleDatagram,
// native/aggregator/aggregator.cc) on sequences of hostile datagrams.
//
// One input is a sequence of frames: [flags:1][len:2 LE][len bytes]. The flags let
// the fuzzer reach deep states without guessing 32-bit keys: bit 0 writes job 1's
// key into R_Key, bit 1 aims the QPN at job 1 (keeping the fuzzed rank bits), bit 2
// makes DMA length / pad agree with the frame, bit 3 sets the jumbo flag (no ICRC),
// bits 4-5 pick the arriving data port (thread). Three jobs are admitted: world sizes
// 3, 1 and 130 (a three-word rank bitmap), payloads 256, 64 and 8 bytes, 4 slots, 2 threads.
// Each thread's frames of one input are one receive (Aggregator::HandleReceive's
// ReceiveState), two frames in a row from each source port, so that the checks a
// receive does once are skipped for the frames that match and taken for the rest.
// Besides ASan/UBSan, the harness checks that the jobs never sum more payload bytes
// than arrived, that every result packet queued is well formed and that its payload
// (read byte by byte) lies inside the job's pool.
#include <arpa/inet.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/aggregator.h"
#include "wire/roce.h"

using namespace netreduce;

namespace {

constexpr uint32_t kKey = 0x5EC12E7u;

struct World {
  std::unique_ptr<Aggregator> agg;
  World() {
    AggregatorConfig cfg;
    cfg.host = "127.0.0.1";
    cfg.port = 4791;
    cfg.slots = 4;
    cfg.payload_bytes = 256;
    cfg.max_jobs = 4;
    cfg.threads = 2;
    cfg.memory_limit = 1 << 20;
    agg.reset(new Aggregator(cfg));
  }
};

}  // namespace

uint64_t Reduced(Aggregator& agg, uint32_t index) {
  std::map<std::string, uint64_t> c;
  agg.JobCounters(index, &c);
  return c["bytes_reduced"];
}

constexpr uint16_t kBoundFrames = 48;  // of at most 64 per input

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Fresh jobs per input (admitted and removed as the control plane would): each
  // input is one reproducible story.
  static World w;
  uint32_t idx[3];
  if (!w.agg->AddJob(3, kKey, &idx[0], 256).ok()) abort();
  if (!w.agg->AddJob(1, kKey ^ 1, &idx[1], 64).ok()) abort();
  if (!w.agg->AddJob(130, kKey ^ 2, &idx[2], 8).ok()) abort();
  // Every rank's data address, as admission binds it: 127.0.0.1, the ports of the
  // first kBoundFrames frames (below); later frames come from strangers (bad_source).
  // Frame f (from 1) comes from port 0x1000 + f / 2.
  const uint32_t sizes[3] = {3, 1, 130};
  for (int j = 0; j < 3; ++j) {
    for (uint32_t r = 0; r < sizes[j]; ++r) {
      if (!w.agg->BindRank(idx[j], r, IpAddr::V4(0x0100007f), 0x1000, kBoundFrames / 2).ok()) abort();
    }
  }
  static ResultBatch out(nullptr);
  ReceiveState receives[2];  // by thread
  uint64_t accepted = 0;
  size_t pos = 0;
  int frames = 0;
  while (pos + 3 <= size && frames++ < 64) {
    const uint8_t flags = data[pos];
    size_t len = size_t(data[pos + 1]) | (size_t(data[pos + 2]) << 8);
    pos += 3;
    len = std::min(len, size - pos);
    std::vector<uint8_t> buf(data + pos, data + pos + len);  // exact size for ASan
    pos += len;
    if (buf.size() >= wire::kHeaderBytes) {
      const uint32_t job = idx[(flags >> 6) % 3];
      if (flags & 1) {
        const uint32_t key = job == idx[0] ? kKey : job == idx[1] ? (kKey ^ 1) : (kKey ^ 2);
        buf[20] = uint8_t(key >> 24); buf[21] = uint8_t(key >> 16);
        buf[22] = uint8_t(key >> 8); buf[23] = uint8_t(key);
      }
      if (flags & 2) {
        const uint32_t qpn = wire::MakeQpn(job, ((uint32_t(buf[6]) << 8 | buf[7]) & (wire::kMaxRanks - 1)));
        buf[5] = uint8_t(qpn >> 16); buf[6] = uint8_t(qpn >> 8); buf[7] = uint8_t(qpn);
      }
      if ((flags & 4) && buf.size() >= wire::kHeaderBytes + wire::kIcrcBytes) {
        const size_t room = buf.size() - wire::kHeaderBytes - wire::kIcrcBytes;
        const uint32_t length = uint32_t(room & ~size_t(3));
        buf.resize(wire::DatagramBytes(length));
        buf[24] = uint8_t(length >> 24); buf[25] = uint8_t(length >> 16);
        buf[26] = uint8_t(length >> 8); buf[27] = uint8_t(length);
        buf[1] &= 0xCF;  // PadCnt 0
      }
      if (flags & 8) buf[8] |= wire::kExtJumbo;
      buf[0] = (flags & 16) ? buf[0] : wire::kOpcodeUcWriteOnlyImm;
    }
    InPacket pkt;
    pkt.buf = buf.data();
    pkt.cap = buf.size();
    pkt.len = buf.size();
    pkt.from = Endpoint{0x0100007f, htons(uint16_t(0x1000 + frames / 2))};
    pkt.local_ip = 0x0100007f;
    const uint32_t thread = (flags >> 5) & 1;
    w.agg->HandleDatagram(thread, uint16_t(4791 + thread), pkt, out, &receives[thread]);
    accepted += buf.size();
    for (const OutPacket& p : out.pkts) {
      // Three pieces (header, payload, trailer), or one: a result built in place around
      // its slot's accumulator (header, payload, pad and ICRC in the pool's memory).
      const iovec& body = p.iovcnt == 3 ? p.iov[1] : p.iov[0];
      if (p.iovcnt == 3) {
        if (p.iov[0].iov_len != wire::kHeaderBytes || p.iov[1].iov_len > 256) abort();
      } else if (p.iovcnt != 1 || p.iov[0].iov_len < wire::DatagramBytes(1) ||
                 p.iov[0].iov_len > wire::DatagramBytes(256)) {
        abort();
      }
      // Reading every result byte: ASan flags a payload pointer outside the pool.
      volatile uint8_t sink = 0;
      const uint8_t* b = static_cast<const uint8_t*>(body.iov_base);
      for (size_t i = 0; i < body.iov_len; ++i) sink ^= b[i];
      (void)sink;
    }
    out.Flush();
  }
  // Nothing is summed that did not arrive: a contribution counts its payload once.
  uint64_t reduced = 0;
  for (uint32_t i : idx) reduced += Reduced(*w.agg, i);
  if (reduced > accepted) abort();
  for (uint32_t i : idx) w.agg->RemoveJob(i);
  return 0;
}
