#include "kernels/cpu/epilogue_avx2.h"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/avx2_util.h"

namespace qlinear::cpu {
namespace {

// One vector of SPEC section 4. kKind: 0 symmetric, 1 static asymmetric, 2 dynamic asymmetric.
template <int kKind, bool kBias>
inline __m256 epilogue_x8(__m256i acc, __m256 sa, __m256i azp, __m256 sb, __m256i adj,
                          __m256 bias) {
  if constexpr (kKind == 0) {
    const __m256 scaled = _mm256_mul_ps(sb, _mm256_cvtepi32_ps(acc));
    return kBias ? _mm256_fmadd_ps(sa, scaled, bias) : _mm256_mul_ps(sa, scaled);
  } else {
    const __m256i corr = kKind == 1 ? adj : _mm256_mullo_epi32(azp, adj);  // wraps, as int32
    const __m256 t = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc, corr));
    return _mm256_fmadd_ps(sa, _mm256_mul_ps(sb, t), kBias ? bias : _mm256_setzero_ps());
  }
}

// The per-column operands of 8 columns from n, of which the first `valid` are real (the rest
// read as zero).
struct Columns {
  __m256 sb, bias;
  __m256i adj, comp;
};

template <int kKind, bool kBias>
inline Columns load_columns(const EpilogueArgs& a, int64_t n, int64_t valid) {
  Columns c;
  c.bias = _mm256_setzero_ps();
  c.adj = _mm256_setzero_si256();
  c.comp = _mm256_setzero_si256();
  if (valid == 8) {
    c.sb = _mm256_loadu_ps(a.sb + n);
    if (kBias) c.bias = _mm256_loadu_ps(a.bias_f + n);
    if (kKind != 0) c.adj = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.azp_adj + n));
    if (a.comp != nullptr) {
      c.comp = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.comp + n));
    }
    return c;
  }
  alignas(32) float sb[8] = {}, bias[8] = {};
  alignas(32) int32_t adj[8] = {}, comp[8] = {};
  const size_t bytes = static_cast<size_t>(4 * valid);
  std::memcpy(sb, a.sb + n, bytes);
  if (kBias) std::memcpy(bias, a.bias_f + n, bytes);
  if (kKind != 0) std::memcpy(adj, a.azp_adj + n, bytes);
  if (a.comp != nullptr) std::memcpy(comp, a.comp + n, bytes);
  c.sb = _mm256_load_ps(sb);
  c.bias = _mm256_load_ps(bias);
  c.adj = _mm256_load_si256(reinterpret_cast<const __m256i*>(adj));
  c.comp = _mm256_load_si256(reinterpret_cast<const __m256i*>(comp));
  return c;
}

template <int kKind, bool kBias, DType kY>
void epilogue_tile(const EpilogueArgs& a, const int32_t* acc, int64_t ld_acc, int64_t m0,
                   int64_t rows, int64_t n0, int64_t cols) {
  const bool has_comp = a.comp != nullptr;
  for (int64_t c = 0; c < cols; c += 8) {
    const int64_t valid = cols - c < 8 ? cols - c : 8;
    const int64_t n = n0 + c;
    const Columns col = load_columns<kKind, kBias>(a, n, valid);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t m = m0 + r;
      __m256i v;
      if (valid == 8) {
        v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + r * ld_acc + c));
      } else {
        alignas(32) int32_t tmp[8] = {};
        std::memcpy(tmp, acc + r * ld_acc + c, static_cast<size_t>(4 * valid));
        v = _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
      }
      if (has_comp) v = _mm256_add_epi32(v, col.comp);
      const __m256 sa = _mm256_set1_ps(a.sa[m]);
      const __m256i azp = kKind == 2 ? _mm256_set1_epi32(a.azp[m]) : _mm256_setzero_si256();
      const __m256 y = epilogue_x8<kKind, kBias>(v, sa, azp, col.sb, col.adj, col.bias);
      if (valid == 8) {
        store_f32x8<kY>(a.y, m * a.ldy + n, y);
      } else {
        store_f32x8_tail<kY>(a.y, m * a.ldy + n, y, valid);
      }
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

void epilogue_s32_avx2(const EpilogueArgs& a, const int32_t* acc, int64_t ld_acc, int64_t m0,
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
