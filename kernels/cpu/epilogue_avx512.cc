#include "kernels/cpu/epilogue_avx512.h"

#include <immintrin.h>

#include "kernels/cpu/avx512_util.h"

namespace qlinear::cpu {
namespace {

// One vector of SPEC section 4. kKind: 0 symmetric, 1 static asymmetric, 2 dynamic asymmetric.
template <int kKind, bool kBias>
inline __m512 epilogue_x16(__m512i acc, __m512 sa, __m512i azp, __m512 sb, __m512i adj,
                           __m512 bias) {
  if constexpr (kKind == 0) {
    const __m512 scaled = _mm512_mul_ps(sb, _mm512_cvtepi32_ps(acc));
    return kBias ? _mm512_fmadd_ps(sa, scaled, bias) : _mm512_mul_ps(sa, scaled);
  } else {
    const __m512i corr = kKind == 1 ? adj : _mm512_mullo_epi32(azp, adj);  // wraps, as int32
    const __m512 t = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, corr));
    return _mm512_fmadd_ps(sa, _mm512_mul_ps(sb, t), kBias ? bias : _mm512_setzero_ps());
  }
}

template <int kKind, bool kBias, DType kY>
void epilogue_tile(const EpilogueArgs& a, const int32_t* acc, int64_t ld_acc, int64_t m0,
                   int64_t rows, int64_t n0, int64_t cols) {
  const bool has_comp = a.comp != nullptr;
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 mask = lanes16(cols - c);
    const int64_t n = n0 + c;
    const __m512 sb = _mm512_maskz_loadu_ps(mask, a.sb + n);
    const __m512 bias = kBias ? _mm512_maskz_loadu_ps(mask, a.bias_f + n) : _mm512_setzero_ps();
    const __m512i adj =
        kKind != 0 ? _mm512_maskz_loadu_epi32(mask, a.azp_adj + n) : _mm512_setzero_si512();
    const __m512i comp =
        has_comp ? _mm512_maskz_loadu_epi32(mask, a.comp + n) : _mm512_setzero_si512();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t m = m0 + r;
      __m512i v = _mm512_maskz_loadu_epi32(mask, acc + r * ld_acc + c);
      if (has_comp) v = _mm512_add_epi32(v, comp);
      const __m512 sa = _mm512_set1_ps(a.sa[m]);
      const __m512i azp = kKind == 2 ? _mm512_set1_epi32(a.azp[m]) : _mm512_setzero_si512();
      store_f32x16<kY>(a.y, m * a.ldy + n, epilogue_x16<kKind, kBias>(v, sa, azp, sb, adj, bias),
                       mask);
    }
  }
}

template <int kKind, bool kBias>
void dispatch_y(const EpilogueArgs& a, const int32_t* acc, int64_t ld_acc, int64_t m0, int64_t rows,
                int64_t n0, int64_t cols) {
  switch (a.y_dtype) {
    case DType::kF32:
      return epilogue_tile<kKind, kBias, DType::kF32>(a, acc, ld_acc, m0, rows, n0, cols);
    case DType::kF16:
      return epilogue_tile<kKind, kBias, DType::kF16>(a, acc, ld_acc, m0, rows, n0, cols);
    case DType::kBF16:
      return epilogue_tile<kKind, kBias, DType::kBF16>(a, acc, ld_acc, m0, rows, n0, cols);
  }
}

template <int kKind>
void dispatch_bias(const EpilogueArgs& a, const int32_t* acc, int64_t ld_acc, int64_t m0,
                   int64_t rows, int64_t n0, int64_t cols) {
  if (a.bias_f != nullptr) {
    dispatch_y<kKind, true>(a, acc, ld_acc, m0, rows, n0, cols);
  } else {
    dispatch_y<kKind, false>(a, acc, ld_acc, m0, rows, n0, cols);
  }
}

}  // namespace

void epilogue_s32_avx512(const EpilogueArgs& a, const int32_t* acc, int64_t ld_acc, int64_t m0,
                         int64_t rows, int64_t n0, int64_t cols) {
  switch (a.scheme) {
    case Scheme::kDynamicSymmetric:
    case Scheme::kStaticSymmetric:
      return dispatch_bias<0>(a, acc, ld_acc, m0, rows, n0, cols);
    case Scheme::kStaticAsymmetric:
      return dispatch_bias<1>(a, acc, ld_acc, m0, rows, n0, cols);
    case Scheme::kDynamicAsymmetric:
      return dispatch_bias<2>(a, acc, ld_acc, m0, rows, n0, cols);
  }
}

}  // namespace qlinear::cpu
