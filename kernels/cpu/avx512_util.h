// Inline AVX-512 helpers shared by the AVX-512 translation units of kernels/cpu (and only by
// them: every function here needs avx512f/bw/vl code generation). Everything has internal
// linkage, so no copy compiled with AVX-512 flags can stand in for a generic one at link time.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/core/dtype.h"

namespace qlinear::cpu {
namespace {

// Mask of the first `n` lanes (n in [0, 16]).
inline __mmask16 lanes16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

// Loads 16 elements (lanes outside `m` read nothing and give +0) widened exactly to fp32.
template <DType T>
inline __m512 load_f32x16(const void* base, int64_t i, __mmask16 m) {
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(base) + i);
  } else if constexpr (T == DType::kBF16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + i);
    return _mm512_cvtph_ps(h);  // fp16 -> fp32 is exact
  }
}

// `out()` of the SPEC: one round-to-nearest-even conversion to T, stored to the lanes in `m` of
// y[i..i+16). Bit-exact with store_from_f32 (kernels/core/dtype.h), NaN and subnormals included.
template <DType T>
inline void store_f32x16(void* base, int64_t i, __m512 v, __mmask16 m) {
  if constexpr (T == DType::kF32) {
    _mm512_mask_storeu_ps(static_cast<float*>(base) + i, m, v);
  } else if constexpr (T == DType::kBF16) {
    // Integer RNE on the dropped 16 bits (VCVTNEPS2BF16 would flush subnormals to zero).
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i r = _mm512_mask_mov_epi32(rounded, nan, quiet);
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(base) + i, m, _mm512_cvtepi32_epi16(r));
  } else {
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(base) + i, m, h);
  }
}

}  // namespace
}  // namespace qlinear::cpu
