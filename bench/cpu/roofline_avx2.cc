#include "bench/cpu/roofline_avx2.h"

#include <immintrin.h>

namespace qlinear::bench {

uint64_t read_stream_avx2(const uint8_t* data, size_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i < bytes; i += 256) {
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(data + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(data + i + 32)));
    c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(data + i + 64)));
    d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(data + i + 96)));
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(data + i + 128)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(data + i + 160)));
    c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(data + i + 192)));
    d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(data + i + 224)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t vpmaddwd_loop_avx2(int64_t iterations) {
  // 12 accumulators, each fed by its own product (2 product registers in turn, renamed apart): more
  // independent chains than latency x throughput, in fixed registers (one asm block, as in
  // vpdpbusd_loop_avx512), so the loop runs at the pair's issue rate.
  if (iterations <= 0) return 0;
  int64_t n = iterations;
  uint32_t out;
  asm volatile(
      "mov $0x00030003, %%eax\n\t"
      "vmovd %%eax, %%xmm14\n\t"
      "vpbroadcastd %%xmm14, %%ymm14\n\t"
      "mov $0xfffbfffb, %%eax\n\t"
      "vmovd %%eax, %%xmm15\n\t"
      "vpbroadcastd %%xmm15, %%ymm15\n\t"
#define QL_Z(i) "vpxor %%ymm" #i ", %%ymm" #i ", %%ymm" #i "\n\t"
      QL_Z(0) QL_Z(1) QL_Z(2) QL_Z(3) QL_Z(4) QL_Z(5) QL_Z(6) QL_Z(7) QL_Z(8) QL_Z(9) QL_Z(10)
          QL_Z(11)
#undef QL_Z
              "1:\n\t"
#define QL_P(i, t)                      \
  "vpmaddwd %%ymm15, %%ymm14, %%ymm" #t \
  "\n\t"                                \
  "vpaddd %%ymm" #t ", %%ymm" #i ", %%ymm" #i "\n\t"
      QL_P(0, 12) QL_P(1, 13) QL_P(2, 12) QL_P(3, 13) QL_P(4, 12) QL_P(5, 13) QL_P(6, 12)
          QL_P(7, 13) QL_P(8, 12) QL_P(9, 13) QL_P(10, 12) QL_P(11, 13)
#undef QL_P
              "dec %[n]\n\t"
              "jnz 1b\n\t"
              "vpaddd %%ymm1, %%ymm0, %%ymm0\n\t"
              "vpaddd %%ymm11, %%ymm0, %%ymm0\n\t"
              "vmovd %%xmm0, %[out]\n\t"
      : [n] "+r"(n), [out] "=r"(out)
      :
      : "eax", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  return out;
}

}  // namespace qlinear::bench
