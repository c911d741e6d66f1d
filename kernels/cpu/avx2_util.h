// Inline AVX2 helpers shared by the AVX2 translation units of kernels/cpu (and only by them: every
// function here needs avx2, fma and f16c code generation). Everything has internal linkage, so no
// copy compiled with AVX2 flags can stand in for a generic one at link time.
//
// AVX2 has no masked 16-bit loads or stores, so a row's last partial vector goes through an
// 8-lane stack buffer (load_f32x8_tail, store_f32x8_tail).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/core/dtype.h"

namespace qlinear::cpu {
namespace {

template <DType T>
constexpr int64_t elem_bytes() {
  return T == DType::kF32 ? 4 : 2;
}

// Loads 8 elements widened exactly to fp32.
template <DType T>
inline __m256 load_f32x8(const void* base, int64_t i) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (T == DType::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);  // fp16 -> fp32 is exact
    }
  }
}

// Loads the n (1..7) elements at i; the lanes past them repeat element i, so that they change no
// maximum, minimum or largest magnitude of the row they belong to.
template <DType T>
inline __m256 load_f32x8_tail(const void* base, int64_t i, int64_t n) {
  constexpr int64_t es = elem_bytes<T>();
  alignas(32) uint8_t tmp[8 * es];
  const uint8_t* src = static_cast<const uint8_t*>(base) + i * es;
  for (int64_t l = 0; l < 8; ++l) std::memcpy(tmp + l * es, src + (l < n ? l : 0) * es, es);
  return load_f32x8<T>(tmp, 0);
}

// `out()` of the SPEC: one round-to-nearest-even conversion to T, written to y[i..i+8). Bit-exact
// with store_from_f32 (kernels/core/dtype.h), NaN and subnormals included.
template <DType T>
inline void store_f32x8(void* base, int64_t i, __m256 v) {
  if constexpr (T == DType::kF32) {
    _mm256_storeu_ps(static_cast<float*>(base) + i, v);
  } else {
    __m128i h;
    if constexpr (T == DType::kBF16) {
      // Integer RNE on the dropped 16 bits; a NaN keeps its sign and top payload, made quiet.
      const __m256i u = _mm256_castps_si256(v);
      const __m256i hi = _mm256_srli_epi32(u, 16);
      const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
      const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
      const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
      h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    } else {
      h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(base) + i), h);
  }
}

// store_f32x8 for the first n (1..7) lanes only.
template <DType T>
inline void store_f32x8_tail(void* base, int64_t i, __m256 v, int64_t n) {
  constexpr int64_t es = elem_bytes<T>();
  alignas(32) uint8_t tmp[8 * es];
  store_f32x8<T>(tmp, 0, v);
  std::memcpy(static_cast<uint8_t*>(base) + i * es, tmp, static_cast<size_t>(n * es));
}

inline uint32_t reduce_max_epu32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

inline float reduce_min_ps(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_min_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(m);
}

inline float reduce_max_ps(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(m);
}

}  // namespace
}  // namespace qlinear::cpu
