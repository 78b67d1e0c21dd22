// hot-buffer CRC speed: ISA-L crc32_gzip_refl against a 256-bit VPCLMULQDQ fold, ns per call;
// and the fold checked against zlib for every length 0..5000 at 4 offsets and random crcs.
#include <isa-l/crc.h>
#include <immintrin.h>
#include <zlib.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define K1056 0x1e88ef372ull
#define K992 0x14a7fe880ull
#define K288 0xf1da05aaull
#define K224 0x15a546366ull
#define K160 0x1751997d0ull
#define K96 0xccaa009eull
__attribute__((target("avx2,vpclmulqdq,pclmul")))
static inline __m256i fold(__m256i a, __m256i k, __m256i b) {
  return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(a, k, 0x00), _mm256_clmulepi64_epi128(a, k, 0x11)), b);
}
__attribute__((target("avx2,vpclmulqdq,pclmul")))
uint32_t crc_v(uint32_t crc, const uint8_t* p, size_t n) {
  if (n < 256) return crc32_gzip_refl(crc, p, n);
  const __m256i k1024 = _mm256_set_epi64x(K992, K1056, K992, K1056);
  __m256i a0 = _mm256_loadu_si256((const __m256i*)p), a1 = _mm256_loadu_si256((const __m256i*)(p + 32)),
          a2 = _mm256_loadu_si256((const __m256i*)(p + 64)), a3 = _mm256_loadu_si256((const __m256i*)(p + 96));
  a0 = _mm256_xor_si256(a0, _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, (int)~crc));
  p += 128; n -= 128;
  while (n >= 128) {
    a0 = fold(a0, k1024, _mm256_loadu_si256((const __m256i*)p));
    a1 = fold(a1, k1024, _mm256_loadu_si256((const __m256i*)(p + 32)));
    a2 = fold(a2, k1024, _mm256_loadu_si256((const __m256i*)(p + 64)));
    a3 = fold(a3, k1024, _mm256_loadu_si256((const __m256i*)(p + 96)));
    p += 128; n -= 128;
  }
  const __m256i k256 = _mm256_set_epi64x(K224, K288, K224, K288);
  a1 = fold(a0, k256, a1); a2 = fold(a1, k256, a2); a3 = fold(a2, k256, a3);
  const __m128i lo = _mm256_castsi256_si128(a3), hi = _mm256_extracti128_si256(a3, 1);
  const __m128i k128 = _mm_set_epi64x(K96, K160);
  const __m128i v = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(lo, k128, 0x00), _mm_clmulepi64_si128(lo, k128, 0x11)), hi);
  uint8_t b[16 + 128]; _mm_storeu_si128((__m128i*)b, v);
  _mm256_zeroupper();
  memcpy(b + 16, p, n);
  return crc32_gzip_refl(0xFFFFFFFFu, b, 16 + n);
}
int main(int argc,char**argv){
  uint8_t *b=aligned_alloc(64, 1<<20); srand(1); for(int i=0;i<1<<20;i++) b[i]=rand();
  int bad=0;
  for (size_t n=0;n<=5000;n++) for (int off=0;off<4;off++) { uint32_t c0=rand();
    uint32_t z=crc32(c0,b+off*13,n), i=crc32_gzip_refl(c0,b+off*13,n), v=crc_v(c0,b+off*13,n);
    if (z!=i||z!=v) { if(bad<5) printf("MISMATCH n=%zu off=%d z=%08x isal=%08x v=%08x\n",n,off,z,i,v); bad++; } }
  printf("mismatches %d\n", bad);
  size_t sizes[]={1432,8936}; int reps=argc>1?atoi(argv[1]):1000000;
  for (int s=0;s<2;s++) { size_t n=sizes[s];
   for (int rep=0;rep<3;rep++) {
    uint32_t c=0; double t0=now();
    for(int r=0;r<reps;r++) c=crc32_gzip_refl(c,b+((r&255)*1472)%((1<<20)-n),n);
    double t1=now();
    for(int r=0;r<reps;r++) c=crc_v(c,b+((r&255)*1472)%((1<<20)-n),n);
    double t2=now();
    printf("n=%zu isal %.1f ns (%.1f GB/s)  vpclmul %.1f ns (%.1f GB/s) c=%08x\n",n,(t1-t0)/reps*1e9,n*reps/(t1-t0)/1e9,(t2-t1)/reps*1e9,n*reps/(t2-t1)/1e9,c);
   }}
  return bad!=0;
}
