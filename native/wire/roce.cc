#include "wire/roce.h"

#include <zlib.h>

#include <cstring>

#if defined(NETREDUCE_HAVE_ISAL)
#include <isa-l/crc.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#elif defined(NETREDUCE_HAVE_LIBDEFLATE)
#include <libdeflate.h>
#endif

namespace netreduce {
namespace wire {
namespace {

inline void Put16(uint8_t* p, uint16_t v) { p[0] = v >> 8; p[1] = uint8_t(v); }
inline void Put24(uint8_t* p, uint32_t v) { p[0] = v >> 16; p[1] = v >> 8; p[2] = uint8_t(v); }
inline void Put32(uint8_t* p, uint32_t v) {
  p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = uint8_t(v);
}
inline void Put64(uint8_t* p, uint64_t v) { Put32(p, uint32_t(v >> 32)); Put32(p + 4, uint32_t(v)); }
inline uint32_t Get24(const uint8_t* p) { return (uint32_t(p[0]) << 16) | (uint32_t(p[1]) << 8) | p[2]; }
inline uint32_t Get32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}
inline uint64_t Get64(const uint8_t* p) { return (uint64_t(Get32(p)) << 32) | Get32(p + 4); }

// CRC-32 (IEEE 802.3, zlib's conditioning), chained from `crc`. The fastest library
// the build found: ISA-L's crc32_gzip_refl (VPCLMULQDQ on AVX-512 where the CPU has
// it: 26 GB/s at 1432 B, 40 GB/s at 8936 B on the development machine), libdeflate's
// (PCLMULQDQ: 9-11 GB/s; with it the ICRC was a third of the aggregator's CPU at MTU
// 1500), or zlib 1.2's table (2.1 GB/s). All give the same values.
#if defined(NETREDUCE_HAVE_ISAL) && defined(__x86_64__)
// ISA-L 2.30's AVX-512 CRC (crc32_gzip_refl_by16_10) returns without VZEROUPPER: the
// upper halves of the vector registers stay dirty, and every legacy-SSE instruction
// after it (this library is built for SSE2) then stalls on them: on an Intel Xeon with
// AVX-512, a tenth of the aggregator's and the engine's samples sat on the first SSE
// instruction after a CRC, and clearing them made the aggregator 1.46x faster per byte
// at MTU 1500 (BENCHMARKS.md). One instruction, where the CPU has AVX at all.
const bool kCpuHasAvx = __builtin_cpu_supports("avx");
__attribute__((target("avx"))) void ZeroUpperVectorHalves() { _mm256_zeroupper(); }
#endif

#if defined(NETREDUCE_HAVE_ISAL) && defined(__x86_64__)
// CRC-32 by 256-bit carry-less multiplies, for a CPU with VPCLMULQDQ and AVX2 but no
// AVX-512 (AMD Zen 3): ISA-L 2.30 takes VPCLMULQDQ only with AVX-512 (zmm), and on
// such a CPU runs its 128-bit PCLMULQDQ loop (crc32_gzip_refl_by8). Four ymm
// accumulators fold 128 bytes a loop trip (eight multiplies where by8 makes sixteen),
// then fold into one another and into one 128-bit remainder V with
// crc_raw(0, data so far) = crc_raw(0, V), which ISA-L finishes with the tail:
// crc32(c, data) = crc32(~0, V || tail). The initial crc, complemented as in
// zlib's conditioning, is XORed into the first four bytes.
//
// A fold over d bytes multiplies an accumulator's low 64 bits by
// reflect32(x^(8d+32) mod P) << 1 and its high 64 bits by reflect32(x^(8d-32) mod P) << 1
// (Intel, "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"; the same
// rule gives Linux's crc32-pclmul constants for d = 16 and 64). P = 0x104C11DB7.
constexpr uint64_t kFold128Lo = 0x1e88ef372ull;  // d = 128: x^1056
constexpr uint64_t kFold128Hi = 0x14a7fe880ull;  //          x^992
constexpr uint64_t kFold32Lo = 0x0f1da05aaull;   // d = 32:  x^288
constexpr uint64_t kFold32Hi = 0x15a546366ull;   //          x^224
constexpr uint64_t kFold16Lo = 0x1751997d0ull;   // d = 16:  x^160
constexpr uint64_t kFold16Hi = 0x0ccaa009eull;   //          x^96
// Below this many bytes ISA-L's own call is as fast (two folds' set-up and two small
// calls to finish cost about what the loop saves).
constexpr size_t kWideCrcMin = 256;
const bool kCpuHasWideClmul = [] {
  __builtin_cpu_init();  // a static initializer may run before libgcc's own
  return __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx2") &&
         !__builtin_cpu_supports("avx512f");
}();

// a's two 128-bit lanes each moved d bytes on (k: d's two constants per lane), plus next.
__attribute__((target("avx2,vpclmulqdq,pclmul"))) inline __m256i Fold(__m256i a, __m256i k,
                                                                      __m256i next) {
  const __m256i lo = _mm256_clmulepi64_epi128(a, k, 0x00);
  const __m256i hi = _mm256_clmulepi64_epi128(a, k, 0x11);
  return _mm256_xor_si256(_mm256_xor_si256(lo, hi), next);
}

__attribute__((target("avx2"))) inline __m256i Load32(const uint8_t* q) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
}

// n >= kWideCrcMin.
__attribute__((target("avx2,vpclmulqdq,pclmul"))) uint32_t Crc32Wide(uint32_t crc,
                                                                     const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_xor_si256(Load32(p), _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, int(~crc)));
  __m256i a1 = Load32(p + 32), a2 = Load32(p + 64), a3 = Load32(p + 96);
  p += 128;
  n -= 128;
  const __m256i k128 = _mm256_set_epi64x(kFold128Hi, kFold128Lo, kFold128Hi, kFold128Lo);
  for (; n >= 128; p += 128, n -= 128) {
    a0 = Fold(a0, k128, Load32(p));
    a1 = Fold(a1, k128, Load32(p + 32));
    a2 = Fold(a2, k128, Load32(p + 64));
    a3 = Fold(a3, k128, Load32(p + 96));
  }
  const __m256i k32 = _mm256_set_epi64x(kFold32Hi, kFold32Lo, kFold32Hi, kFold32Lo);
  a3 = Fold(Fold(Fold(a0, k32, a1), k32, a2), k32, a3);
  const __m128i lo = _mm256_castsi256_si128(a3), hi = _mm256_extracti128_si256(a3, 1);
  const __m128i k16 = _mm_set_epi64x(kFold16Hi, kFold16Lo);
  const __m128i v = _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(lo, k16, 0x00), _mm_clmulepi64_si128(lo, k16, 0x11)), hi);
  // V then the tail (< 128 bytes) in one call: two calls cost ~20 ns more per chunk.
  alignas(16) uint8_t rest[16 + 128];
  _mm_store_si128(reinterpret_cast<__m128i*>(rest), v);
  _mm256_zeroupper();
  std::memcpy(rest + 16, p, n);
  return crc32_gzip_refl(0xFFFFFFFFu, rest, uint64_t(16 + n));
}
#endif

inline uint32_t Crc32(uint32_t crc, const uint8_t* p, size_t n) {
#if defined(NETREDUCE_HAVE_ISAL)
#if defined(__x86_64__)
  if (n >= kWideCrcMin && kCpuHasWideClmul) return Crc32Wide(crc, p, n);
#endif
  const uint32_t v = crc32_gzip_refl(crc, p, uint64_t(n));
#if defined(__x86_64__)
  if (kCpuHasAvx) ZeroUpperVectorHalves();
#endif
  return v;
#elif defined(NETREDUCE_HAVE_LIBDEFLATE)
  return libdeflate_crc32(crc, p, n);
#else
  return uint32_t(crc32(crc, p, uInt(n)));
#endif
}

// IcrcIpIdDelta's table for one datagram length: the delta of every ID a GSO send
// can give. A few lengths per thread (a job has one full-chunk length and a tail).
struct IdDeltas {
  size_t datagram = 0;
  uint32_t delta[kMaxGsoSegments];
};

const IdDeltas& DeltasFor(size_t datagram) {
  thread_local IdDeltas cache[4];
  IdDeltas& e = cache[(datagram >> 2) & 3];
  if (e.datagram == datagram) return e;
  // The ID is bytes 12-13 of the CRC's input (8 bytes of masked LRH, then the IPv4
  // header's first 4 bytes); 14 bytes of IPv4 header, 8 of UDP and the datagram less
  // its ICRC follow it. Two inputs of equal length that differ only in the ID differ
  // in CRC by the linear CRC of the ID's bits followed by that many zero bytes:
  // crc(ID bytes) ^ crc(two zero bytes) (the affine parts cancel), moved past the
  // zeros by crc32_combine_op's multiplication by x^(8n) mod P.
  const uLong shift = crc32_combine_gen64(z_off64_t(datagram + 18));
  static const uint8_t kZero2[2] = {0, 0};
  const uLong zero = crc32(0L, kZero2, 2);
  uint32_t basis[16];
  for (int b = 0; b < 16; ++b) {
    const uint8_t id[2] = {uint8_t((1u << b) >> 8), uint8_t(1u << b)};
    basis[b] = uint32_t(crc32_combine_op(crc32(0L, id, 2) ^ zero, 0, shift));
  }
  for (uint32_t k = 0; k < kMaxGsoSegments; ++k) {
    uint32_t d = 0;
    for (int b = 0; b < 16; ++b) {
      if (k & (1u << b)) d ^= basis[b];
    }
    e.delta[k] = d;
  }
  e.datagram = datagram;
  return e;
}

}  // namespace

uint32_t IcrcIpIdDelta(size_t datagram_bytes, uint32_t id) {
  return id < kMaxGsoSegments ? DeltasFor(datagram_bytes).delta[id] : 0;
}

const uint32_t* IcrcIpIdDeltas(size_t datagram_bytes) { return DeltasFor(datagram_bytes).delta; }

void Encode(const Header& h, uint8_t* out) {
  out[0] = h.opcode;
  out[1] = uint8_t((h.pad & 3) << 4);  // SE=0 M=0 PadCnt TVer=0
  Put16(out + 2, kDefaultPKey);
  out[4] = 0;
  Put24(out + 5, h.dest_qp & 0xFFFFFF);
  out[8] = uint8_t((h.jumbo ? kExtJumbo : 0) | (h.result && h.repeat_seen ? kExtRepeatSeen : 0) |
                   (!h.result && h.ack_req ? kAckReqBit : 0) | (h.result && h.held ? kExtHeld : 0) |
                   (h.udp_checksum ? kExtUdpChecksum : 0) |
                   (!h.result && h.group_seen ? kExtGroupSeen : 0));
  Put24(out + 9, h.psn & kPsnMask);
  const uint64_t va = (uint64_t(h.dtype & 0xF) << 60) | (uint64_t(h.op & 0x3) << 58) |
                      (uint64_t(h.shadow & 1) << 57) | (uint64_t(h.result ? 1 : 0) << 56) |
                      (uint64_t(h.slot) << 40) | (h.offset & kMaxOffset);
  Put64(out + 12, va);
  Put32(out + 20, h.key);
  Put32(out + 24, h.length);
  Put32(out + 28, h.msg_id);
}

DecodeError Decode(const uint8_t* pkt, size_t len, Header* h) {
  if (len < kHeaderBytes + kIcrcBytes) return DecodeError::kTruncated;
  h->opcode = pkt[0];
  if (h->opcode != kOpcodeUcWriteOnlyImm) return DecodeError::kBadOpcode;
  h->pad = (pkt[1] >> 4) & 3;
  h->dest_qp = Get24(pkt + 5);
  h->jumbo = (pkt[8] & kExtJumbo) != 0;
  h->psn = Get24(pkt + 9);
  const uint64_t va = Get64(pkt + 12);
  h->dtype = uint8_t(va >> 60);
  h->op = uint8_t((va >> 58) & 3);
  h->shadow = uint8_t((va >> 57) & 1);
  h->result = ((va >> 56) & 1) != 0;
  h->repeat_seen = h->result && (pkt[8] & kExtRepeatSeen) != 0;
  h->ack_req = !h->result && (pkt[8] & kAckReqBit) != 0;
  h->held = h->result && (pkt[8] & kExtHeld) != 0;
  h->udp_checksum = (pkt[8] & kExtUdpChecksum) != 0;
  h->group_seen = !h->result && (pkt[8] & kExtGroupSeen) != 0;
  h->slot = uint16_t(va >> 40);
  h->offset = va & kMaxOffset;
  h->key = Get32(pkt + 20);
  h->length = Get32(pkt + 24);
  h->msg_id = Get32(pkt + 28);
  const size_t limit = h->jumbo ? kMaxPayload : kRoceMaxPayload;
  if (h->length > limit) return DecodeError::kBadLength;
  if (PaddedLength(h->length) - h->length != h->pad) return DecodeError::kBadLength;
  if (DatagramBytes(h->length) != len) return DecodeError::kBadLength;
  return DecodeError::kOk;
}

namespace {

// The ICRC's input ahead of the payload -- 8 x 0xFF (masked LRH), IP header (20 or
// 40), UDP header (8), the 32-byte header with BTH byte 4 masked -- built in `out`
// (88 bytes at most) so that one CRC call covers it; returns its length.
size_t IcrcPrefix(const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
                  uint16_t dst_port_be, const uint8_t* header, size_t payload_len, size_t pad,
                  uint8_t* out) {
  std::memset(out, 0xFF, 8);
  uint8_t* ip = out + 8;
  const size_t udp_len = 8 + kHeaderBytes + payload_len + pad + kIcrcBytes;
  size_t ip_len;
  if (dst.is_v4()) {
    ip_len = 20;
    ip[0] = 0x45;             // version 4, IHL 5
    ip[1] = 0xFF;             // TOS masked
    Put16(ip + 2, uint16_t(20 + udp_len));
    Put16(ip + 4, 0);         // ID: 0 for DF datagrams of unconnected sockets
    Put16(ip + 6, 0x4000);    // DF
    ip[8] = 0xFF;             // TTL masked
    ip[9] = 17;               // UDP
    Put16(ip + 10, 0xFFFF);   // header checksum masked
    std::memcpy(ip + 12, src.bytes + 12, 4);
    std::memcpy(ip + 16, dst.bytes + 12, 4);
  } else {
    ip_len = 40;
    // Version 6, then traffic class (8 bits) and flow label (20 bits) masked.
    ip[0] = 0x6F;
    ip[1] = ip[2] = ip[3] = 0xFF;
    Put16(ip + 4, uint16_t(udp_len));  // payload length: what follows the IPv6 header
    ip[6] = 17;               // next header: UDP
    ip[7] = 0xFF;             // hop limit masked
    std::memcpy(ip + 8, src.bytes, 16);
    std::memcpy(ip + 24, dst.bytes, 16);
  }
  uint8_t* udp = ip + ip_len;
  std::memcpy(udp, &src_port_be, 2);
  std::memcpy(udp + 2, &dst_port_be, 2);
  Put16(udp + 4, uint16_t(udp_len));
  Put16(udp + 6, 0xFFFF);   // UDP checksum masked
  uint8_t* hdr = udp + 8;
  std::memcpy(hdr, header, kHeaderBytes);
  hdr[4] = 0xFF;            // FECN, BECN, resv6 masked
  return 8 + ip_len + 8 + kHeaderBytes;
}

constexpr size_t kMaxPrefix = 8 + 40 + 8 + kHeaderBytes;

// `crc` carried on over the payload and its pad's zero bytes.
uint32_t CrcPayload(uint32_t crc, const uint8_t* payload, size_t payload_len, size_t pad) {
  if (payload_len) crc = Crc32(crc, payload, payload_len);
  static const uint8_t kZeros[4] = {0, 0, 0, 0};
  if (pad) crc = Crc32(crc, kZeros, pad);
  return crc;
}

// Moving a CRC past n bytes (multiplication by x^(8n) mod P) is linear over GF(2):
// four tables of 256 values, built once per length with zlib's crc32_combine_op.
struct Shift {
  size_t bytes = 0;
  uint32_t t[4][256];
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

const Shift& ShiftFor(size_t bytes) {
  thread_local Shift cache[4];  // a job has one full-chunk length and a tail
  Shift& e = cache[(bytes >> 3) & 3];
  if (e.bytes == bytes) return e;
  const uLong op = crc32_combine_gen64(z_off64_t(bytes));
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      e.t[k][b] = uint32_t(crc32_combine_op(uLong(b) << (8 * k), 0, op));
    }
  }
  e.bytes = bytes;
  return e;
}

}  // namespace

uint32_t ComputeIcrc(const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
                     uint16_t dst_port_be, const uint8_t* header, const uint8_t* payload,
                     size_t payload_len, size_t pad) {
  uint8_t prefix[kMaxPrefix];
  const size_t n = IcrcPrefix(src, dst, src_port_be, dst_port_be, header, payload_len, pad, prefix);
  return CrcPayload(Crc32(0, prefix, n), payload, payload_len, pad);
}

uint32_t IcrcSeed(const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
                  uint16_t dst_port_be, size_t payload_len, size_t pad) {
  uint8_t prefix[kMaxPrefix];
  static const uint8_t kNoHeader[kHeaderBytes] = {};
  const size_t n = IcrcPrefix(src, dst, src_port_be, dst_port_be, kNoHeader, payload_len, pad, prefix);
  return Crc32(0, prefix, n - kHeaderBytes);
}

uint32_t IcrcFromSeed(uint32_t seed, const uint8_t* header, const uint8_t* payload,
                      size_t payload_len, size_t pad) {
  uint8_t hdr[kHeaderBytes];
  std::memcpy(hdr, header, kHeaderBytes);
  hdr[4] = 0xFF;  // FECN, BECN, resv6 masked, as IcrcPrefix
  return CrcPayload(Crc32(seed, hdr, kHeaderBytes), payload, payload_len, pad);
}

uint32_t PayloadCrc(const uint8_t* payload, size_t payload_len, size_t pad) {
  return CrcPayload(0, payload, payload_len, pad);
}

uint32_t ComputeIcrcWith(const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
                         uint16_t dst_port_be, const uint8_t* header, size_t payload_len,
                         size_t pad, uint32_t payload_crc) {
  uint8_t prefix[kMaxPrefix];
  const size_t n = IcrcPrefix(src, dst, src_port_be, dst_port_be, header, payload_len, pad, prefix);
  const uint32_t head = Crc32(0, prefix, n);
  if (payload_len + pad == 0) return head;
  return ShiftFor(payload_len + pad)(head) ^ payload_crc;
}

void WriteTrailer(const Header& h, const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
                  uint16_t dst_port_be, const uint8_t* header, const uint8_t* payload,
                  uint8_t* trailer, const uint32_t* payload_crc) {
  std::memset(trailer, 0, h.pad);
  uint32_t icrc = 0;
  if (!h.jumbo) {
    icrc = payload_crc != nullptr
               ? ComputeIcrcWith(src, dst, src_port_be, dst_port_be, header, h.length, h.pad,
                                 *payload_crc)
               : ComputeIcrc(src, dst, src_port_be, dst_port_be, header, payload, h.length, h.pad);
  }
  std::memcpy(trailer + h.pad, &icrc, 4);  // little-endian on the wire, as rxe stores it
}

void WriteTrailerFromSeed(const Header& h, uint32_t seed, const uint8_t* header,
                          const uint8_t* payload, uint8_t* trailer) {
  std::memset(trailer, 0, h.pad);
  const uint32_t icrc = h.jumbo ? 0 : IcrcFromSeed(seed, header, payload, h.length, h.pad);
  std::memcpy(trailer + h.pad, &icrc, 4);  // little-endian on the wire, as WriteTrailer
}

bool IcrcValid(const Header& h, const IpAddr& src, const IpAddr& dst, uint16_t src_port_be,
               uint16_t dst_port_be, const uint8_t* pkt) {
  if (h.jumbo) return true;
  const uint8_t* payload = pkt + kHeaderBytes;
  uint32_t want;
  std::memcpy(&want, payload + h.length + h.pad, 4);
  const uint32_t got = ComputeIcrc(src, dst, src_port_be, dst_port_be, pkt, payload, h.length, h.pad);
  if (got == want) return true;
  if (!dst.is_v4()) return false;
  // Segment k of a GSO send (IPv4 ID k): the ICRC differs by that ID's delta.
  const IdDeltas& d = DeltasFor(DatagramBytes(h.length));
  const uint32_t diff = got ^ want;
  for (uint32_t k = 1; k < kMaxGsoSegments; ++k) {
    if (d.delta[k] == diff) return true;
  }
  return false;
}

}  // namespace wire
}  // namespace netreduce
