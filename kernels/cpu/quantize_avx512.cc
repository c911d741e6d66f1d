#include "kernels/cpu/quantize_avx512.h"

#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/avx512_util.h"

namespace qlinear::cpu {
namespace {

// Scalar sat32 of the reference (rne, clamp to int32, NaN -> 0), used once per row. Builtins
// rather than <cmath>'s inline functions: no out-of-line copy of a shared inline function may be
// compiled in this file (its AVX-512 code could stand in for the generic one at link time).
int32_t sat32_scalar(float v) {
  if (__builtin_isnan(v)) return 0;
  const float r = __builtin_nearbyintf(v);
  if (r >= 2147483648.f) return INT32_MAX;
  if (r < -2147483648.f) return INT32_MIN;
  return static_cast<int32_t>(r);
}

// sat32(rne(v)) on 16 lanes, exactly as reference::sat32. VCVTPS2DQ gives INT32_MIN for NaN and
// for every out-of-range value; only the positive side and NaN need fixing. (rne(v) >= 2^31
// exactly when v >= 2^31: floats below 2^31 are at most 2^31 - 128.)
inline __m512i sat32_x16(__m512 v) {
  __m512i q = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  q = _mm512_mask_mov_epi32(q, _mm512_cmp_ps_mask(v, _mm512_set1_ps(2147483648.f), _CMP_GE_OQ),
                            _mm512_set1_epi32(INT32_MAX));
  q = _mm512_mask_mov_epi32(q, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_setzero_si512());
  return q;
}

// Whether the largest |x| bit pattern seen marks a NaN or an Inf.
inline bool non_finite(uint32_t abs_bits_max) { return abs_bits_max >= 0x7f800000u; }

enum class Op { kMul, kDiv };

// Writes xq for one row: q = sat8(sat32(x op c) + zp) (zp = 0 for symmetric schemes; the int32
// addition wraps as the reference's does). With kExact false the caller guarantees |x op c| <
// 2^30 for the whole row (so no NaN and no int32 saturation): VCVTPS2DQ alone is sat32 then.
template <DType T, Op kOp, bool kZp, bool kExact>
void quantize_pass(const void* x, int64_t k, float c, int32_t zp, bool shift, int8_t* out) {
  const __m512 cv = _mm512_set1_ps(c);
  const __m512i zv = _mm512_set1_epi32(zp);
  const __m128i flip = _mm_set1_epi8(shift ? static_cast<char>(0x80) : 0);
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = lanes16(k - i);
    const __m512 v = load_f32x16<T>(x, i, m);
    const __m512 r = kOp == Op::kMul ? _mm512_mul_ps(v, cv) : _mm512_div_ps(v, cv);
    __m512i q = kExact ? sat32_x16(r)
                       : _mm512_cvt_roundps_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if constexpr (kZp) q = _mm512_add_epi32(q, zv);
    const __m128i b = _mm_xor_si128(_mm512_cvtsepi32_epi8(q), flip);  // VPMOVSDB: sat8
    _mm_mask_storeu_epi8(out + i, m, b);
  }
}

// Largest |x| bit pattern of a row (a NaN or Inf shows as >= 0x7f800000).
template <DType T>
uint32_t abs_bits_max(const void* x, int64_t k) {
  const __m512i mag = _mm512_set1_epi32(0x7fffffff);
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    a0 = _mm512_max_epu32(a0,
                          _mm512_and_si512(_mm512_castps_si512(load_f32x16<T>(x, i, 0xffff)), mag));
    a1 = _mm512_max_epu32(
        a1, _mm512_and_si512(_mm512_castps_si512(load_f32x16<T>(x, i + 16, 0xffff)), mag));
  }
  for (; i < k; i += 16) {
    a0 = _mm512_max_epu32(
        a0, _mm512_and_si512(_mm512_castps_si512(load_f32x16<T>(x, i, lanes16(k - i))), mag));
  }
  return _mm512_reduce_max_epu32(_mm512_max_epu32(a0, a1));
}

// Row min and max (meaningful only when the row is finite) and the largest |x| bit pattern, in
// one pass.
template <DType T>
uint32_t min_max(const void* x, int64_t k, float* mn, float* mx) {
  const __m512i mag = _mm512_set1_epi32(0x7fffffff);
  __m512 lo = _mm512_set1_ps(__builtin_inff()), hi = _mm512_set1_ps(-__builtin_inff());
  __m512i a = _mm512_setzero_si512();
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = lanes16(k - i);
    const __m512 v = load_f32x16<T>(x, i, m);
    lo = _mm512_mask_min_ps(lo, m, lo, v);
    hi = _mm512_mask_max_ps(hi, m, hi, v);
    a = _mm512_max_epu32(a, _mm512_and_si512(_mm512_castps_si512(v), mag));
  }
  *mn = _mm512_reduce_min_ps(lo);
  *mx = _mm512_reduce_max_ps(hi);
  return _mm512_reduce_max_epu32(a);
}

// Below this bound for |x op c| over a row, the row takes the fast pass (see quantize_pass).
constexpr float kFastBound = 1073741824.f;  // 2^30

template <DType T, Op kOp, bool kZp>
void quantize_pass_checked(const void* x, int64_t k, float c, float row_bound, int32_t zp,
                           bool shift, int8_t* out) {
  // row_bound = absmax op c, rounded the same way as every element's x op c and monotonic in
  // |x|, so it bounds them all; NaN (0 * Inf) or Inf fail the comparison and take the exact pass.
  if (row_bound < kFastBound) {
    quantize_pass<T, kOp, kZp, false>(x, k, c, zp, shift, out);
  } else {
    quantize_pass<T, kOp, kZp, true>(x, k, c, zp, shift, out);
  }
}

// One row; returns false if it holds a non-finite value.
template <DType T>
bool quantize_row(const QuantizeArgs& a, const void* x, int8_t* out, float* sa, int32_t* azp) {
  const int64_t k = a.k;
  // absmax as the largest |x| bit pattern: the same value as max(fabs(x)), +0 for a zero row.
  float mn = 0.f, mx = 0.f;
  const uint32_t bits =
      a.scheme == Scheme::kDynamicAsymmetric ? min_max<T>(x, k, &mn, &mx) : abs_bits_max<T>(x, k);
  if (non_finite(bits)) return false;
  float absmax;
  std::memcpy(&absmax, &bits, 4);
  const bool shift = a.shift_to_u8;
  switch (a.scheme) {
    case Scheme::kDynamicSymmetric: {
      *sa = absmax / 127.f;
      const float inv = absmax == 0.f ? 0.f : 127.f / absmax;
      quantize_pass_checked<T, Op::kMul, false>(x, k, inv, absmax * inv, 0, shift, out);
      return true;
    }
    case Scheme::kStaticSymmetric: {
      const float s = a.input_scale;
      *sa = s;
      quantize_pass_checked<T, Op::kDiv, false>(x, k, s, absmax / s, 0, shift, out);
      return true;
    }
    case Scheme::kDynamicAsymmetric: {
      // The reference keeps the first of equal values; the sign of a zero min or max only shows
      // in s for a row of zeros, where the reference computes x[0] - x[0] = +0.
      const float s = (mn == 0.f && mx == 0.f) ? 0.f : (mx - mn) / 255.f;
      *sa = s;
      if (s == 0.f) {
        if (azp != nullptr) *azp = 0;
        std::memset(out, a.shift_to_u8 ? 0x80 : 0, static_cast<size_t>(k));
        return true;
      }
      const int32_t zp = sat32_scalar(-128.f - mn / s);
      if (azp != nullptr) *azp = zp;
      const float inv = 1.f / s;
      quantize_pass_checked<T, Op::kMul, true>(x, k, inv, absmax * inv, zp, shift, out);
      return true;
    }
    case Scheme::kStaticAsymmetric: {
      *sa = a.input_scale;
      if (azp != nullptr) *azp = a.input_zero_point;
      const float inv = 1.f / a.input_scale;
      quantize_pass_checked<T, Op::kMul, true>(x, k, inv, absmax * inv, a.input_zero_point, shift,
                                               out);
      return true;
    }
  }
  return true;
}

template <DType T>
int64_t quantize_rows(const QuantizeArgs& a, int64_t row_begin, int64_t row_end) {
  const size_t in_row = static_cast<size_t>(a.k) * (T == DType::kF32 ? 4 : 2);
  const int pad_value = a.shift_to_u8 ? 0x80 : 0;
  // In tiles, each row is quantized into this thread's row buffer, then dealt out 64 bytes a tile
  // (a copy from L1, small beside the quantization).
  thread_local std::vector<int8_t> row_buffer;
  if (a.xq_tiles && row_buffer.size() < static_cast<size_t>(a.xq_stride)) {
    row_buffer.resize(static_cast<size_t>(a.xq_stride));
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    const void* x = static_cast<const uint8_t*>(a.x) + static_cast<size_t>(r) * in_row;
    int8_t* out = a.xq_tiles ? row_buffer.data() : a.xq + r * a.xq_stride;
    if (!quantize_row<T>(a, x, out, a.sa + r, a.azp == nullptr ? nullptr : a.azp + r)) return r;
    if (a.xq_stride > a.k) {
      std::memset(out + a.k, pad_value, static_cast<size_t>(a.xq_stride - a.k));
    }
    if (a.xq_tiles) {
      int8_t* tile_row = a.xq + r / 16 * 16 * a.xq_stride + r % 16 * 64;
      for (int64_t j = 0; j < a.xq_stride / 64; ++j) {
        _mm512_storeu_si512(tile_row + j * 1024, _mm512_loadu_si512(out + j * 64));
      }
    }
  }
  return -1;
}

}  // namespace

int64_t quantize_rows_avx512(const QuantizeArgs& args, int64_t row_begin, int64_t row_end) {
  switch (args.x_dtype) {
    case DType::kF32:
      return quantize_rows<DType::kF32>(args, row_begin, row_end);
    case DType::kF16:
      return quantize_rows<DType::kF16>(args, row_begin, row_end);
    case DType::kBF16:
      return quantize_rows<DType::kBF16>(args, row_begin, row_end);
  }
  return -1;
}

}  // namespace qlinear::cpu
