// The seam between the data plane and the wire. The engine and the aggregator see
// only this interface; transport/udp/ implements it over kernel UDP sockets with
// sendmmsg/recvmmsg, and transport/verbs/ implements the same interface over an
// RDMA UC queue pair (RDMA WRITE with immediate), where the NIC builds the headers
// that the UDP transport's callers build by hand.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace netreduce {

// An IPv4 endpoint, both fields in network byte order.
struct Endpoint {
  uint32_t ip = 0;
  uint16_t port = 0;
  bool operator==(const Endpoint& o) const { return ip == o.ip && port == o.port; }
};
std::string ToString(const Endpoint& e);

// One datagram to send, gathered from up to three pieces (header, payload, trailer).
struct OutPacket {
  Endpoint to;
  uint32_t from_ip = 0;  // source address to use (network order); 0 = the kernel's choice
  iovec iov[3];
  int iovcnt = 0;
};

// One received datagram: the caller provides `buf`/`cap`; the transport fills the rest.
struct InPacket {
  uint8_t* buf = nullptr;
  size_t cap = 0;
  size_t len = 0;
  Endpoint from;
  uint32_t local_ip = 0;  // the address the sender targeted (network order)
  // The transport has already checked the packet's integrity (a verbs NIC checks the
  // ICRC before it completes a receive): the caller need not recompute it.
  bool verified = false;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Sends all `n` packets (blocking while the socket buffer is full).
  virtual Status SendBatch(OutPacket* pkts, size_t n) = 0;
  // Waits up to `timeout_us` for datagrams, then fills up to `max` of them.
  virtual Status RecvBatch(InPacket* pkts, size_t max, int64_t timeout_us, size_t* got) = 0;
  // Zero-copy receive in two steps: look at the first `n` bytes of the next datagram
  // (waiting up to `timeout_us`), learning its full length and sender, then receive it
  // scattered straight into the caller's memory (header, destination, trailer).
  // PeekHeader returns with *len = 0 when nothing arrived.
  virtual Status PeekHeader(uint8_t* buf, size_t n, int64_t timeout_us, size_t* len,
                            Endpoint* from) = 0;
  virtual Status RecvScatter(iovec* iov, int iovcnt, size_t* len) = 0;
  virtual Endpoint local() const = 0;
  // A descriptor that polls readable when datagrams wait (the verbs transport
  // gives its completion channel's).
  virtual int PollFd() const = 0;
  // Called before waiting on PollFd(): *ready = something can be received now. A
  // verbs transport arms its completion channel here (and finds completions that
  // landed before the arm); a socket needs nothing.
  virtual Status PrepareWait(bool* ready) {
    *ready = false;
    return Status::Ok();
  }
  // The most chunks one message may have on this transport (verbs: 2^16, the chunk
  // field of its RETH.VA; docs/protocol.md "Verbs peers").
  virtual uint64_t MaxMessageChunks() const { return ~uint64_t(0); }
};

// Waits up to `timeout_us` until any of `n` transports has something to read.
Status WaitReadable(Transport* const* transports, size_t n, int64_t timeout_us);

}  // namespace netreduce
