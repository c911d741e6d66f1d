#include "kernels/cpu/quantize_avx2.h"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/avx2_util.h"

namespace qlinear::cpu {
namespace {

// Scalar sat32 of the reference (rne, clamp to int32, NaN -> 0), used once per row. Builtins
// rather than <cmath>'s inline functions: no out-of-line copy of a shared inline function may be
// compiled in this file (its AVX2 code could stand in for the generic one at link time).
int32_t sat32_scalar(float v) {
  if (__builtin_isnan(v)) return 0;
  const float r = __builtin_nearbyintf(v);
  if (r >= 2147483648.f) return INT32_MAX;
  if (r < -2147483648.f) return INT32_MIN;
  return static_cast<int32_t>(r);
}

inline __m256 round_even(__m256 v) {
  return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// sat32(rne(v)) on 8 lanes, exactly as reference::sat32. VCVTPS2DQ gives INT32_MIN for NaN and for
// every out-of-range value; only the positive side and NaN need fixing. (rne(v) >= 2^31 exactly
// when v >= 2^31: floats below 2^31 are at most 2^31 - 128.)
inline __m256i sat32_x8(__m256 v) {
  __m256i q = _mm256_cvtps_epi32(round_even(v));
  const __m256 big = _mm256_cmp_ps(v, _mm256_set1_ps(2147483648.f), _CMP_GE_OQ);
  q = _mm256_blendv_epi8(q, _mm256_set1_epi32(INT32_MAX), _mm256_castps_si256(big));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_andnot_si256(_mm256_castps_si256(nan), q);
}

// sat8 of 8 int32 lanes, as 8 int16 in lane order: VPACKSSDW clamps to int16 (per 128-bit half),
// the halves are joined, and a clamp to [-128, 127] follows; two clamps in a row are one.
inline __m128i sat8_x8_as_i16(__m256i q) {
  const __m256i s16 = _mm256_packs_epi32(q, q);  // [q0..q3 q0..q3 | q4..q7 q4..q7]
  const __m128i joined = _mm256_castsi256_si128(_mm256_permute4x64_epi64(s16, 0x08));
  return _mm_min_epi16(_mm_max_epi16(joined, _mm_set1_epi16(-128)), _mm_set1_epi16(127));
}

// Whether the largest |x| bit pattern seen marks a NaN or an Inf.
inline bool non_finite(uint32_t abs_bits_max) { return abs_bits_max >= 0x7f800000u; }

enum class Op { kMul, kDiv };

// Where one row's quantized values go: int8 (optionally shifted to uint8) or int16.
struct RowOut {
  int8_t* xq = nullptr;
  int16_t* xq16 = nullptr;
  bool shift = false;

  void store(int64_t i, __m128i v16, int64_t n) const {
    if (xq16 != nullptr) {
      if (n == 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(xq16 + i), v16);
      } else {
        alignas(16) int16_t tmp[8];
        _mm_store_si128(reinterpret_cast<__m128i*>(tmp), v16);
        std::memcpy(xq16 + i, tmp, static_cast<size_t>(2 * n));
      }
      return;
    }
    __m128i b = _mm_packs_epi16(v16, v16);  // in range already
    if (shift) b = _mm_xor_si128(b, _mm_set1_epi8(static_cast<char>(0x80)));
    if (n == 8) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(xq + i), b);
    } else {
      alignas(16) int8_t tmp[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), b);
      std::memcpy(xq + i, tmp, static_cast<size_t>(n));
    }
  }
  // Values [from, to) of the row set to the encoding's zero (xq = 0).
  void fill_zero(int64_t from, int64_t to) const {
    if (to <= from) return;
    if (xq16 != nullptr) {
      std::memset(xq16 + from, 0, static_cast<size_t>(2 * (to - from)));
    } else {
      std::memset(xq + from, shift ? 0x80 : 0, static_cast<size_t>(to - from));
    }
  }
};

// Writes xq for one row: q = sat8(sat32(x op c) + zp) (zp = 0 for symmetric schemes; the int32
// addition wraps as the reference's does). With kExact false the caller guarantees |x op c| <
// 2^30 for the whole row (so no NaN and no int32 saturation): VCVTPS2DQ alone is sat32 then.
template <DType T, Op kOp, bool kZp, bool kExact>
void quantize_pass(const void* x, int64_t k, float c, int32_t zp, const RowOut& out) {
  const __m256 cv = _mm256_set1_ps(c);
  const __m256i zv = _mm256_set1_epi32(zp);
  auto one = [&](__m256 v) {
    const __m256 r = kOp == Op::kMul ? _mm256_mul_ps(v, cv) : _mm256_div_ps(v, cv);
    __m256i q = kExact ? sat32_x8(r) : _mm256_cvtps_epi32(round_even(r));
    if constexpr (kZp) q = _mm256_add_epi32(q, zv);
    return sat8_x8_as_i16(q);
  };
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) out.store(i, one(load_f32x8<T>(x, i)), 8);
  if (i < k) out.store(i, one(load_f32x8_tail<T>(x, i, k - i)), k - i);
}

// Largest |x| bit pattern of a row (a NaN or Inf shows as >= 0x7f800000).
template <DType T>
uint32_t abs_bits_max(const void* x, int64_t k) {
  const __m256i mag = _mm256_set1_epi32(0x7fffffff);
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    a0 = _mm256_max_epu32(a0, _mm256_and_si256(_mm256_castps_si256(load_f32x8<T>(x, i)), mag));
    a1 = _mm256_max_epu32(a1, _mm256_and_si256(_mm256_castps_si256(load_f32x8<T>(x, i + 8)), mag));
  }
  for (; i + 8 <= k; i += 8) {
    a0 = _mm256_max_epu32(a0, _mm256_and_si256(_mm256_castps_si256(load_f32x8<T>(x, i)), mag));
  }
  if (i < k) {
    a1 = _mm256_max_epu32(
        a1, _mm256_and_si256(_mm256_castps_si256(load_f32x8_tail<T>(x, i, k - i)), mag));
  }
  return reduce_max_epu32(_mm256_max_epu32(a0, a1));
}

// Row min and max (meaningful only when the row is finite) and the largest |x| bit pattern, in
// one pass.
template <DType T>
uint32_t min_max(const void* x, int64_t k, float* mn, float* mx) {
  const __m256i mag = _mm256_set1_epi32(0x7fffffff);
  __m256 lo = _mm256_set1_ps(__builtin_inff()), hi = _mm256_set1_ps(-__builtin_inff());
  __m256i a = _mm256_setzero_si256();
  auto one = [&](__m256 v) {
    lo = _mm256_min_ps(lo, v);
    hi = _mm256_max_ps(hi, v);
    a = _mm256_max_epu32(a, _mm256_and_si256(_mm256_castps_si256(v), mag));
  };
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) one(load_f32x8<T>(x, i));
  if (i < k) one(load_f32x8_tail<T>(x, i, k - i));
  *mn = reduce_min_ps(lo);
  *mx = reduce_max_ps(hi);
  return reduce_max_epu32(a);
}

// Below this bound for |x op c| over a row, the row takes the fast pass (see quantize_pass).
constexpr float kFastBound = 1073741824.f;  // 2^30

template <DType T, Op kOp, bool kZp>
void quantize_pass_checked(const void* x, int64_t k, float c, float row_bound, int32_t zp,
                           const RowOut& out) {
  // row_bound = absmax op c, rounded the same way as every element's x op c and monotonic in
  // |x|, so it bounds them all; NaN (0 * Inf) or Inf fail the comparison and take the exact pass.
  if (row_bound < kFastBound) {
    quantize_pass<T, kOp, kZp, false>(x, k, c, zp, out);
  } else {
    quantize_pass<T, kOp, kZp, true>(x, k, c, zp, out);
  }
}

// One row; returns false if it holds a non-finite value.
template <DType T>
bool quantize_row(const QuantizeArgs& a, const void* x, const RowOut& out, float* sa,
                  int32_t* azp) {
  const int64_t k = a.k;
  // absmax as the largest |x| bit pattern: the same value as max(fabs(x)), +0 for a zero row.
  float mn = 0.f, mx = 0.f;
  const uint32_t bits =
      a.scheme == Scheme::kDynamicAsymmetric ? min_max<T>(x, k, &mn, &mx) : abs_bits_max<T>(x, k);
  if (non_finite(bits)) return false;
  float absmax;
  std::memcpy(&absmax, &bits, 4);
  switch (a.scheme) {
    case Scheme::kDynamicSymmetric: {
      *sa = absmax / 127.f;
      const float inv = absmax == 0.f ? 0.f : 127.f / absmax;
      quantize_pass_checked<T, Op::kMul, false>(x, k, inv, absmax * inv, 0, out);
      return true;
    }
    case Scheme::kStaticSymmetric: {
      const float s = a.input_scale;
      *sa = s;
      quantize_pass_checked<T, Op::kDiv, false>(x, k, s, absmax / s, 0, out);
      return true;
    }
    case Scheme::kDynamicAsymmetric: {
      // The reference keeps the first of equal values; the sign of a zero min or max only shows
      // in s for a row of zeros, where the reference computes x[0] - x[0] = +0.
      const float s = (mn == 0.f && mx == 0.f) ? 0.f : (mx - mn) / 255.f;
      *sa = s;
      if (s == 0.f) {
        if (azp != nullptr) *azp = 0;
        out.fill_zero(0, k);
        return true;
      }
      const int32_t zp = sat32_scalar(-128.f - mn / s);
      if (azp != nullptr) *azp = zp;
      const float inv = 1.f / s;
      quantize_pass_checked<T, Op::kMul, true>(x, k, inv, absmax * inv, zp, out);
      return true;
    }
    case Scheme::kStaticAsymmetric: {
      *sa = a.input_scale;
      if (azp != nullptr) *azp = a.input_zero_point;
      const float inv = 1.f / a.input_scale;
      quantize_pass_checked<T, Op::kMul, true>(x, k, inv, absmax * inv, a.input_zero_point, out);
      return true;
    }
  }
  return true;
}

template <DType T>
int64_t quantize_rows(const QuantizeArgs& a, int16_t* xq16, int64_t row_begin, int64_t row_end) {
  const size_t in_row = static_cast<size_t>(a.k * elem_bytes<T>());
  for (int64_t r = row_begin; r < row_end; ++r) {
    const void* x = static_cast<const uint8_t*>(a.x) + static_cast<size_t>(r) * in_row;
    RowOut out;
    if (xq16 != nullptr) {
      out.xq16 = xq16 + r * a.xq_stride;
    } else {
      out.xq = a.xq + r * a.xq_stride;
      out.shift = a.shift_to_u8;
    }
    if (!quantize_row<T>(a, x, out, a.sa + r, a.azp == nullptr ? nullptr : a.azp + r)) return r;
    out.fill_zero(a.k, a.xq_stride);
  }
  return -1;
}

}  // namespace

int64_t quantize_rows_avx2(const QuantizeArgs& args, int16_t* xq16, int64_t row_begin,
                           int64_t row_end) {
  switch (args.x_dtype) {
    case DType::kF32:
      return quantize_rows<DType::kF32>(args, xq16, row_begin, row_end);
    case DType::kF16:
      return quantize_rows<DType::kF16>(args, xq16, row_begin, row_end);
    case DType::kBF16:
      return quantize_rows<DType::kBF16>(args, xq16, row_begin, row_end);
  }
  return -1;
}

}  // namespace qlinear::cpu
