#include "kernels/cpu/avx2_gemm.h"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/epilogue_avx2.h"

namespace qlinear::cpu {
namespace {

inline int32_t load_i32(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// One k-step of a register tile: the NV weight vectors widened once, then for each row the
// activation pair broadcast and multiplied into every column vector.
template <int MR, int NV>
inline void tile_step(const int16_t* a, int64_t lda, const int8_t* bk, int64_t s,
                      __m256i (&c)[MR][NV]) {
  __m256i bv[NV];
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v) {
    bv[v] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bk + 16 * v)));
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    const __m256i ai = _mm256_set1_epi32(load_i32(a + i * lda + 2 * s));
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) c[i][v] = _mm256_add_epi32(c[i][v], _mm256_madd_epi16(bv[v], ai));
  }
  // Each accumulator is whole in its register after every k-step: without this GCC 12 adds the
  // products of two unrolled k-steps together first, which needs more than 16 registers and
  // spills the tile to the stack.
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) asm("" : "+x"(c[i][v]));
  }
}

// One register tile: MR rows x NV vectors of 8 columns over `ksteps` k-steps of 2. The
// accumulators start at zero (first K block) or at c_out (a later block), and end in c_out
// [MR][kAvx2Panel]. b points to the panel at the block's first k-step; b_step is the panel's bytes
// per k-step (16 NV); a to the rows' activations at the same k.
template <int MR, int NV, bool kPrefetch>
void tile_kernel(const int16_t* a, int64_t lda, const int8_t* b, int64_t b_step, int64_t ksteps,
                 bool first, int32_t* c_out, int64_t pf) {
  __m256i c[MR][NV];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      c[i][v] =
          first
              ? _mm256_setzero_si256()
              : _mm256_load_si256(reinterpret_cast<const __m256i*>(c_out + i * kAvx2Panel + 8 * v));
    }
  }
  int64_t s = 0;
  // Two k-steps per iteration: 64 bytes of a full panel, one cache line, one prefetch.
  for (; s + 2 <= ksteps; s += 2) {
    const int8_t* bk = b + s * b_step;
    if constexpr (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(bk + pf), _MM_HINT_T0);
    tile_step<MR, NV>(a, lda, bk, s, c);
    tile_step<MR, NV>(a, lda, bk + b_step, s + 1, c);
  }
  if (s < ksteps) tile_step<MR, NV>(a, lda, b + s * b_step, s, c);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(c_out + i * kAvx2Panel + 8 * v), c[i][v]);
    }
  }
}

using TileFn = void (*)(const int16_t*, int64_t, const int8_t*, int64_t, int64_t, bool, int32_t*,
                        int64_t);

template <bool kPrefetch, int MR>
constexpr TileFn tile_for_nv(int nv) {
  return nv == 1 ? &tile_kernel<MR, 1, kPrefetch> : &tile_kernel<MR, 2, kPrefetch>;
}

template <bool kPrefetch>
TileFn tile_for(int mr, int nv) {
  switch (mr) {
    case 1:
      return tile_for_nv<kPrefetch, 1>(nv);
    case 2:
      return tile_for_nv<kPrefetch, 2>(nv);
    case 3:
      return tile_for_nv<kPrefetch, 3>(nv);
    case 4:
      return tile_for_nv<kPrefetch, 4>(nv);
    case 5:
      return tile_for_nv<kPrefetch, 5>(nv);
    default:
      return tile_for_nv<kPrefetch, 6>(nv);
  }
}

static_assert(kAvx2Mr == 6, "tile_for covers MR = 1..6");

// Writes finished accumulator rows [m, m + rows) of panel columns [n0, n0 + cols): through the
// epilogue to y, or raw to acc_out.
void finish_rows(const Avx2GemmArgs& g, const int32_t* tile, int64_t m, int64_t rows, int64_t n0,
                 int64_t cols) {
  if (g.acc_out != nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(g.acc_out + (m + r) * g.ld_acc + n0, tile + r * kAvx2Panel,
                  static_cast<size_t>(cols) * 4);
    }
  } else {
    epilogue_s32_avx2(g.epi, tile, kAvx2Panel, m, rows, n0, cols);
  }
}

// K blocking, for long K only, as in the VNNI GEMM: up to kKBlock the whole K of a tile stays in
// registers and the row tiles re-read the panel (16 x K bytes) from L2; a longer panel is cut into
// kKBlock-deep blocks that every row of the call shares while the block is in L2, with the
// accumulators parked in acc_scratch between blocks.
constexpr int64_t kKBlock = 4096;

}  // namespace

void pack_weights_avx2(const int8_t* w, int64_t n, int64_t k, int64_t k_pad, int64_t n_pad,
                       int8_t* packed, int64_t p_begin, int64_t p_end) {
  // In the packed order, so the writes are sequential and the reads advance along the panel's
  // rows together: a 2-byte pair per column and k-step.
  const int64_t whole_steps = k / 2;  // k-steps with both values inside K
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t n0 = p * kAvx2Panel;
    const int64_t cols = n_pad - n0 >= kAvx2Panel ? kAvx2Panel : n_pad - n0;
    const int64_t real = n - n0 < cols ? n - n0 : cols;  // columns < n: the rest are padding
    int8_t* out = packed + n0 * k_pad;
    for (int64_t s = 0; s < k_pad / 2; ++s, out += 2 * cols) {
      if (s < whole_steps) {
        for (int64_t c = 0; c < real; ++c) std::memcpy(out + 2 * c, w + (n0 + c) * k + 2 * s, 2);
      } else {
        for (int64_t c = 0; c < real; ++c) {
          out[2 * c] = w[(n0 + c) * k + 2 * s];  // K odd: the last step's second value is padding
          out[2 * c + 1] = 0;
        }
      }
      std::memset(out + 2 * real, 0, static_cast<size_t>(2 * (cols - real)));
    }
  }
}

void gemm_s16s8_avx2(const Avx2GemmArgs& g, int64_t m_begin, int64_t m_end, int64_t p_begin,
                     int64_t p_end, int32_t* acc) {
  const int64_t ksteps = g.k_pad / 2;
  const int64_t block_steps = kKBlock / 2;
  const bool blocked = ksteps > block_steps && m_end - m_begin > kAvx2Mr;
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t n0 = p * kAvx2Panel;
    const int nv = g.n_pad - n0 >= kAvx2Panel ? 2 : 1;
    const int8_t* b = g.packed + n0 * g.k_pad;
    const int64_t b_step = nv * 16;
    const int64_t cols = (g.n - n0) < kAvx2Panel ? g.n - n0 : kAvx2Panel;
    if (!blocked) {
      for (int64_t m = m_begin; m < m_end; m += kAvx2Mr) {
        const int mr = static_cast<int>(m_end - m < kAvx2Mr ? m_end - m : kAvx2Mr);
        const TileFn fn = g.prefetch_bytes > 0 ? tile_for<true>(mr, nv) : tile_for<false>(mr, nv);
        fn(g.x16 + m * g.ldx, g.ldx, b, b_step, ksteps, true, acc, g.prefetch_bytes);
        finish_rows(g, acc, m, mr, n0, cols);
      }
      continue;
    }
    for (int64_t s0 = 0; s0 < ksteps; s0 += block_steps) {
      const int64_t steps = ksteps - s0 < block_steps ? ksteps - s0 : block_steps;
      for (int64_t m = m_begin; m < m_end; m += kAvx2Mr) {
        const int mr = static_cast<int>(m_end - m < kAvx2Mr ? m_end - m : kAvx2Mr);
        const TileFn fn = g.prefetch_bytes > 0 ? tile_for<true>(mr, nv) : tile_for<false>(mr, nv);
        fn(g.x16 + m * g.ldx + 2 * s0, g.ldx, b + s0 * b_step, b_step, steps, s0 == 0,
           acc + (m - m_begin) * kAvx2Panel, g.prefetch_bytes);
      }
    }
    finish_rows(g, acc, m_begin, m_end - m_begin, n0, cols);
  }
}

}  // namespace qlinear::cpu
