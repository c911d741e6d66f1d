#include "bench/cpu/roofline_avx512.h"

#include <immintrin.h>

namespace qlinear::bench {

uint64_t read_stream_avx512(const uint8_t* data, size_t bytes) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (size_t i = 0; i < bytes; i += 256) {
    a = _mm512_add_epi64(a, _mm512_load_si512(data + i));
    b = _mm512_add_epi64(b, _mm512_load_si512(data + i + 64));
    c = _mm512_add_epi64(c, _mm512_load_si512(data + i + 128));
    d = _mm512_add_epi64(d, _mm512_load_si512(data + i + 192));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
  uint64_t sum = 0;
  for (uint64_t v : lanes) sum += v;
  return sum;
}

uint64_t vpdpbusd_loop_avx512(int64_t iterations) {
  // 24 independent accumulators (more than latency x throughput, so the loop runs at the issue
  // rate) in fixed registers: one asm block, so that no compiler choice (GCC 12 keeps an array of
  // accumulators in memory around asm statements) puts loads or stores in the loop.
  if (iterations <= 0) return 0;
  int64_t n = iterations;
  uint32_t out;
  asm volatile(
      "mov $0x03030303, %%eax\n\t"
      "vpbroadcastd %%eax, %%zmm24\n\t"
      "mov $0xfbfbfbfb, %%eax\n\t"
      "vpbroadcastd %%eax, %%zmm25\n\t"
#define QL_Z(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"
      QL_Z(0) QL_Z(1) QL_Z(2) QL_Z(3) QL_Z(4) QL_Z(5) QL_Z(6) QL_Z(7) QL_Z(8) QL_Z(9) QL_Z(10)
          QL_Z(11) QL_Z(12) QL_Z(13) QL_Z(14) QL_Z(15) QL_Z(16) QL_Z(17) QL_Z(18) QL_Z(19) QL_Z(20)
              QL_Z(21) QL_Z(22) QL_Z(23)
#undef QL_Z
                  "1:\n\t"
#define QL_D(i) "vpdpbusd %%zmm25, %%zmm24, %%zmm" #i "\n\t"
      QL_D(0) QL_D(1) QL_D(2) QL_D(3) QL_D(4) QL_D(5) QL_D(6) QL_D(7) QL_D(8) QL_D(9) QL_D(10)
          QL_D(11) QL_D(12) QL_D(13) QL_D(14) QL_D(15) QL_D(16) QL_D(17) QL_D(18) QL_D(19) QL_D(20)
              QL_D(21) QL_D(22) QL_D(23)
#undef QL_D
                  "dec %[n]\n\t"
                  "jnz 1b\n\t"
                  "vpaddd %%zmm1, %%zmm0, %%zmm0\n\t"
                  "vpaddd %%zmm23, %%zmm0, %%zmm0\n\t"
                  "vmovd %%xmm0, %[out]\n\t"
      : [n] "+r"(n), [out] "=r"(out)
      :
      : "eax", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19",
        "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25");
  return out;
}

}  // namespace qlinear::bench
