// How a batch of datagrams becomes UDP GSO sends: runs of segmentable packets to one
// destination, from one source address, all of one length but the last (which may be
// shorter: a message's tail chunk), at most kMaxGsoSegments of them and 64 KiB in
// all, as the kernel's UDP_SEGMENT takes them (udp_send_skb: every segment but the
// last exactly gso_size bytes, no more than UDP_MAX_SEGMENTS). A packet that cannot
// join its destination's open run starts a new one; non-segmentable packets are runs
// of one. Runs leave in the order of their first packets and keep their packets'
// order, so a destination sees its packets in batch order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/transport.h"

namespace netreduce {

struct GsoRun {
  uint32_t first = 0;  // index of the run's first packet in the batch
  uint32_t last = 0;
  uint32_t count = 0;  // packets (segments)
  uint32_t seg = 0;    // bytes of each segment but the last
  uint32_t bytes = 0;  // all segments
  bool closed = false; // a shorter last segment (or a non-segmentable packet) ended it
};

class GsoRuns {
 public:
  // Groups pkts[0..n). UDP payloads of a run are at most `max_bytes` together.
  void Plan(const OutPacket* pkts, size_t n, uint32_t max_segments, uint32_t max_bytes);
  const std::vector<GsoRun>& runs() const { return runs_; }
  // The packet after `i` in its run (valid while i != its run's last).
  uint32_t next(uint32_t i) const { return next_[i]; }

 private:
  std::vector<GsoRun> runs_;
  std::vector<uint32_t> next_;
  std::vector<int32_t> table_;  // open addressing: destination -> its open run (-1 none)
};

// The UDP payload bytes of one packet.
inline size_t PacketBytes(const OutPacket& p) {
  size_t n = 0;
  for (int k = 0; k < p.iovcnt; ++k) n += p.iov[k].iov_len;
  return n;
}

}  // namespace netreduce
