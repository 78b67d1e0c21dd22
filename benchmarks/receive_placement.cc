// What a rank's receive of results costs, by how the payloads reach dst (issue 33:
// "results straight into place"). A sender thread sends 64 MiB of results as the
// aggregator does (UDP GSO runs of one size, header + payload + ICRC each) over
// loopback to a UDP GRO socket; the receiving thread takes them with one of:
//
//   staged       recvmmsg of coalesced runs into 64 KiB staging buffers, then each
//                payload copied into its place in dst (the engine's batch path,
//                message_results.cc DrainBatch: plain stores with dst prefetched two
//                chunks ahead below 8 KiB, streaming stores chunk by chunk from 8 KiB)
//   staged-stream the same, payloads that follow each other in dst streamed as one
//                (whole lines by non-temporal stores across chunk edges; tried in the
//                engine on branch rankcpu-stream, not landed: BENCHMARKS.md, issue 33)
//   staged-nocopy the same receive, no copy: what the copy itself costs (dst wrong)
//   direct       peek at the run's first header, then one recvmsg scattering every
//                payload straight into its place in dst (headers and trailers into
//                scratch, 2 iovecs per datagram), no copy in user space
//   direct-pf    direct, with the lines of the next run's places in dst prefetched
//                for write while this run is handled
//
// and its thread's CPU time per 64 MiB is printed (CLOCK_THREAD_CPUTIME_ID), modes
// alternated round by round; dst is evicted from the caches before each round (a
// large all-reduce's dst is cold). benchmarks/receive_placement.py builds and runs it.
//
//   receive_placement PAYLOAD_BYTES ROUNDS
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

constexpr size_t kHdr = 32, kTrail = 4;
constexpr size_t kTotal = size_t(64) << 20;
constexpr size_t kStaging = 8;  // coalesced receives per recvmmsg (512 KiB)
constexpr size_t kBuf = 65536;
const char* const kModes[] = {"staged", "staged-stream", "staged-nocopy", "direct", "direct-pf"};
constexpr int kNumModes = 5;

size_t pay, dgram, chunks, per_run;
std::atomic<uint64_t> received{0};
std::atomic<uint64_t> go_round{0};

double ThreadCpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void StreamCopy(uint8_t* d, const uint8_t* s, size_t n) {
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  if (n < head + 64) return void(memcpy(d, s, n));
  memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
  }
  memcpy(d + i, s + i, n - i);
}
#else
void StreamCopy(uint8_t* d, const uint8_t* s, size_t n) { memcpy(d, s, n); }
#endif

// Branch rankcpu-stream's StreamWriter (engine/prefetch.h there; AVX2 only here).
struct StreamWriter {
  uint8_t* end = nullptr;
  size_t have = 0;
  alignas(64) uint8_t line[64];
  void Finish() {
    if (end != nullptr && have > 0) memcpy(end - have, line, have);
    end = nullptr;
    have = 0;
#if defined(__x86_64__)
    _mm_sfence();
#endif
  }
#if defined(__x86_64__)
  __attribute__((target("avx2"))) void Copy(uint8_t* d, const uint8_t* s, size_t n) {
    if (d != end) {
      if (end != nullptr && have > 0) memcpy(end - have, line, have);
      end = nullptr;
      have = 0;
      const size_t head = std::min(n, size_t((64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63));
      memcpy(d, s, head);
      d += head, s += head, n -= head;
      if (n == 0) return;
      end = d;
    }
    if (have > 0) {
      const size_t k = std::min(64 - have, n);
      memcpy(line + have, s, k);
      have += k, s += k, n -= k, end += k;
      if (have < 64) return;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(end - 64), a);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(end - 32), b);
      have = 0;
    }
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(end + i), a);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(end + i + 32), b);
    }
    have = n - i;
    memcpy(line, s + i, have);
    end += n;
  }
#else
  void Copy(uint8_t* d, const uint8_t* s, size_t n) { memcpy(d, s, n); }
#endif
};

void PrefetchW(const uint8_t* p, size_t n) {
  for (size_t off = 0; off < n; off += 64) __builtin_prefetch(p + off, 1, 3);
}

void Sender(int port, const uint8_t* src, int rounds) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  int sb = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(uint16_t(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<uint8_t> hdrs(chunks * (kHdr + kTrail));
  std::vector<iovec> iov(3 * per_run);
  for (int r = 0; r < rounds; ++r) {
    while (go_round.load() <= uint64_t(r)) usleep(100);
    uint64_t sent = 0;
    for (size_t c = 0; c < chunks;) {
      // At most 4 MiB ahead of the receiver: nothing dropped.
      while (sent - (received.load() - uint64_t(r) * chunks) > (4u << 20) / dgram) usleep(20);
      const size_t n = std::min(per_run, chunks - c);
      for (size_t k = 0; k < n; ++k) {
        uint8_t* h = &hdrs[(c + k) * (kHdr + kTrail)];
        const uint64_t idx = c + k;
        memcpy(h, &idx, 8);
        iov[3 * k] = {h, kHdr};
        iov[3 * k + 1] = {const_cast<uint8_t*>(src + (c + k) * pay), pay};
        iov[3 * k + 2] = {h + kHdr, kTrail};
      }
      msghdr m{};
      m.msg_name = &to;
      m.msg_namelen = sizeof to;
      m.msg_iov = iov.data();
      m.msg_iovlen = 3 * n;
      char cbuf[CMSG_SPACE(sizeof(uint16_t))] = {};
      m.msg_control = cbuf;
      m.msg_controllen = sizeof cbuf;
      cmsghdr* cm = CMSG_FIRSTHDR(&m);
      cm->cmsg_level = SOL_UDP;
      cm->cmsg_type = UDP_SEGMENT;
      cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      const uint16_t seg = uint16_t(dgram);
      memcpy(CMSG_DATA(cm), &seg, 2);
      if (sendmsg(fd, &m, 0) < 0) {
        perror("sendmsg (UDP GSO)");
        exit(1);
      }
      c += n;
      sent += n;
    }
  }
  close(fd);
}

// One round's receive of `chunks` results in `mode`; returns the datagrams taken.
uint64_t ReceiveStaged(int fd, uint8_t* dst, std::vector<uint8_t>& staging, bool copy, bool stream) {
  StreamWriter w;
  mmsghdr msgs[kStaging];
  iovec iov[kStaging];
  char cbufs[kStaging][64];
  for (size_t i = 0; i < kStaging; ++i) {
    iov[i] = {staging.data() + i * (kBuf + 4160), kBuf};
    msgs[i].msg_hdr = msghdr{};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
    msgs[i].msg_hdr.msg_control = cbufs[i];
    msgs[i].msg_hdr.msg_controllen = sizeof cbufs[i];
  }
  const int n = recvmmsg(fd, msgs, kStaging, MSG_DONTWAIT, nullptr);
  uint64_t got = 0;
  for (int i = 0; i < n; ++i) {
    size_t seg = 0;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msgs[i].msg_hdr); cm; cm = CMSG_NXTHDR(&msgs[i].msg_hdr, cm)) {
      if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
        int v = 0;
        memcpy(&v, CMSG_DATA(cm), sizeof v);
        seg = size_t(v);
      }
    }
    const size_t len = msgs[i].msg_len;
    if (seg == 0) seg = len;
    const uint8_t* b = static_cast<const uint8_t*>(iov[i].iov_base);
    for (size_t off = 0; off < len; off += seg, ++got) {
      uint64_t idx;
      memcpy(&idx, b + off, 8);
      if (!copy) continue;
      if (stream) {
        w.Copy(dst + idx * pay, b + off + kHdr, pay);
      } else if (pay >= 8192) {
        StreamCopy(dst + idx * pay, b + off + kHdr, pay);
      } else {
        memcpy(dst + idx * pay, b + off + kHdr, pay);
        if (idx + 2 < chunks) PrefetchW(dst + (idx + 2) * pay, pay);
      }
    }
  }
#if defined(__x86_64__)
  if (pay >= 8192) _mm_sfence();
#endif
  if (stream) w.Finish();
  return got;
}

uint64_t ReceiveDirect(int fd, uint8_t* dst, std::vector<uint8_t>& scratch, std::vector<uint8_t>& tail,
                       bool prefetch) {
  uint64_t got = 0;
  for (int k = 0; k < int(kStaging); ++k) {
    uint8_t first[kHdr];
    const ssize_t len = recv(fd, first, kHdr, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
    if (len <= 0) break;
    uint64_t idx;
    memcpy(&idx, first, 8);
    const size_t n = std::min<size_t>((size_t(len) + dgram - 1) / dgram, 64);
    iovec iov[2 * 64 + 1];
    size_t trail = 0;
    for (size_t j = 0; j < n; ++j) {
      iov[2 * j] = {scratch.data() + j * 64, trail + kHdr};
      iov[2 * j + 1] = {dst + (idx + j) * pay, pay};
      trail = kTrail;
    }
    iov[2 * n] = {tail.data(), tail.size()};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = 2 * n + 1;
    const ssize_t g = recvmsg(fd, &m, MSG_DONTWAIT);
    if (g <= 0) break;
    const size_t segs = (size_t(g) + dgram - 1) / dgram;
    for (size_t j = 0; j < segs; ++j) {
      uint64_t id2;
      memcpy(&id2, scratch.data() + j * 64 + (j ? kTrail : 0), 8);
      if (id2 != idx + j) {
        fprintf(stderr, "a run out of order (%llu where %llu was expected)\n",
                (unsigned long long)id2, (unsigned long long)(idx + j));
        exit(1);
      }
      if (prefetch && pay < 8192 && idx + j + n < chunks) PrefetchW(dst + (idx + j + n) * pay, pay);
    }
    got += segs;
  }
  return got;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s PAYLOAD_BYTES ROUNDS\n", argv[0]);
    return 2;
  }
  pay = size_t(atoi(argv[1]));
  const int rounds = atoi(argv[2]);
  dgram = kHdr + pay + kTrail;
  chunks = kTotal / pay;
  per_run = std::min<size_t>(64, 65000 / dgram);
  const int rfd = socket(AF_INET, SOCK_DGRAM, 0);
  int rb = 32 << 20, one = 1;
  setsockopt(rfd, SOL_SOCKET, SO_RCVBUFFORCE, &rb, sizeof rb);
  if (setsockopt(rfd, SOL_UDP, UDP_GRO, &one, sizeof one) != 0) {
    perror("UDP_GRO");
    return 1;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(rfd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t al = sizeof a;
  getsockname(rfd, reinterpret_cast<sockaddr*>(&a), &al);
  std::vector<uint8_t> src(kTotal), dst(kTotal), evict(size_t(96) << 20);
  for (size_t i = 0; i < kTotal; ++i) src[i] = uint8_t(i * 7 + i / 4099);
  std::vector<uint8_t> staging(kStaging * (kBuf + 4160)), scratch(64 * 64), tail(kBuf);
  std::thread sender(Sender, ntohs(a.sin_port), src.data(), rounds);
  for (int r = 0; r < rounds; ++r) {
    const int mode = r % kNumModes;
    memset(evict.data(), r, evict.size());  // dst out of the caches
    memset(dst.data(), 0, dst.size());
    memset(evict.data(), r + 1, evict.size());
    go_round.store(uint64_t(r) + 1);
    const double t0 = ThreadCpu();
    uint64_t got = 0;
    while (got < chunks) {
      pollfd p{rfd, POLLIN, 0};
      poll(&p, 1, 1000);
      const uint64_t n = mode < 3 ? ReceiveStaged(rfd, dst.data(), staging, mode != 2, mode == 1)
                                  : ReceiveDirect(rfd, dst.data(), scratch, tail, mode == 4);
      got += n;
      received.fetch_add(n);
    }
    const double dt = ThreadCpu() - t0;
    const bool exact = memcmp(dst.data(), src.data(), chunks * pay) == 0;
    printf("%s %.3f %s\n", kModes[mode], dt * 1e3, mode == 2 ? "-" : exact ? "exact" : "WRONG");
    fflush(stdout);
  }
  sender.join();
  return 0;
}
