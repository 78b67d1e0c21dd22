// libFuzzer harness: the packet decoder (native/wire/roce.cc) on arbitrary datagrams.
//
// Properties checked on every input, besides memory safety (ASan/UBSan):
// * Decode never reads past `len` and accepts only datagrams whose DMA length, pad
//   and size agree (so the payload and the ICRC lie inside the datagram);
// * a decoded header re-encodes to the same 32 bytes (modulo the bits Decode does
//   not keep: SE/M/TVer, P_Key, resv8a, AckReq and the other reserved bits);
// * IcrcValid runs on what Decode accepted, and a packet whose trailer
//   WriteTrailer computed verifies.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/roce.h"

using namespace netreduce;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size heap copy, so that ASan sees any read past the datagram.
  std::vector<uint8_t> pkt(data, data + size);
  wire::Header h;
  if (wire::Decode(pkt.data(), pkt.size(), &h) != wire::DecodeError::kOk) return 0;
  if (wire::DatagramBytes(h.length) != size) abort();
  if (h.length > (h.jumbo ? wire::kMaxPayload : wire::kRoceMaxPayload)) abort();
  uint8_t again[wire::kHeaderBytes];
  wire::Encode(h, again);
  static const uint8_t kKept[wire::kHeaderBytes] = {
      0xFF, 0x30, 0, 0, 0, 0xFF, 0xFF, 0xFF, wire::kExtJumbo, 0xFF, 0xFF, 0xFF,
      0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
      0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  for (size_t i = 0; i < wire::kHeaderBytes; ++i) {
    if ((again[i] & kKept[i]) != (pkt[i] & kKept[i])) abort();
  }
  (void)wire::IcrcValid(h, 0x0100007f, 0x0100007f, 0x3412, 0xB712, pkt.data());
  // Rewrite the trailer as a sender would: it must verify.
  std::vector<uint8_t> fixed(pkt);
  std::memcpy(fixed.data(), again, wire::kHeaderBytes);
  wire::WriteTrailer(h, 0x0100007f, 0x0200007f, 0x3412, 0xB712, fixed.data(),
                     fixed.data() + wire::kHeaderBytes, fixed.data() + wire::kHeaderBytes + h.length);
  if (!wire::IcrcValid(h, 0x0100007f, 0x0200007f, 0x3412, 0xB712, fixed.data())) abort();
  return 0;
}
