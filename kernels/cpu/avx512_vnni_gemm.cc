#include "kernels/cpu/avx512_vnni_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace qlinear::cpu {
namespace {

// acc += VPDPBUSD(u8 a, s8 b). Inline asm rather than _mm512_dpbusd_epi32: GCC 12 copies the
// accumulator through an extra register for every use of that intrinsic, which halves the
// micro-kernel's issue rate; with "+v" the accumulators stay in place.
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
  return acc;
}

inline int32_t load_u32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// How a register tile prefetches weights as it goes. kNear: the tile's own panel, a fixed distance
// ahead of each k-step, into L1 (a single pass over weights that stream from DRAM). kFar1/2/4: 1, 2
// or 4 lines a k-step into L2 from a separate stream: the next K block's weights while this
// block's row tiles multiply (gemm_u8s8_vnni_avx512).
enum class Pf { kNone, kNear, kFar1, kFar2, kFar4 };

constexpr int far_lines(Pf pf) { return pf == Pf::kFar1 ? 1 : pf == Pf::kFar2 ? 2 : 4; }

// One register tile: MR rows x NV vectors of 16 columns over `ksteps` k-steps of 4. The
// accumulators start at comp (first K block) or, when comp is null, at c_out (a later block), and
// end in c_out [MR][kVnniPanel]. b points to the panel at the block's first k-step; b_step is the
// panel's bytes per k-step. pf: the prefetch stream's start (kNear: b + the distance, advancing
// b_step a k-step; kFar*: advancing 64 * far_lines a k-step).
template <int MR, int NV, Pf kPf>
void tile_kernel(const uint8_t* a, int64_t lda, const int8_t* b, int64_t b_step, int64_t ksteps,
                 const int32_t* comp, int32_t* c_out, const int8_t* pf) {
  __m512i c[MR][NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    if (comp != nullptr) {
      const __m512i cv = _mm512_loadu_si512(comp + 16 * v);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) c[i][v] = cv;
    } else {
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) c[i][v] = _mm512_load_si512(c_out + i * kVnniPanel + 16 * v);
    }
  }
#pragma GCC unroll 2
  for (int64_t s = 0; s < ksteps; ++s) {
    const int8_t* bk = b + s * b_step;
    if constexpr (kPf == Pf::kNear) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm_prefetch(pf + s * b_step + 64 * v, _MM_HINT_T0);
    } else if constexpr (kPf != Pf::kNone) {
      constexpr int kLines = far_lines(kPf);
#pragma GCC unroll 4
      for (int l = 0; l < kLines; ++l) _mm_prefetch(pf + (s * kLines + l) * 64, _MM_HINT_T1);
    }
    __m512i bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_si512(bk + 64 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512i ai = _mm512_set1_epi32(load_u32(a + i * lda + 4 * s));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[i][v] = dpbusd(c[i][v], ai, bv[v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_store_si512(c_out + i * kVnniPanel + 16 * v, c[i][v]);
  }
}

using TileFn = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, int64_t, const int32_t*,
                        int32_t*, const int8_t*);

template <Pf kPf, int MR>
constexpr TileFn tile_for_nv(int nv) {
  return nv == 1   ? &tile_kernel<MR, 1, kPf>
         : nv == 2 ? &tile_kernel<MR, 2, kPf>
         : nv == 3 ? &tile_kernel<MR, 3, kPf>
                   : &tile_kernel<MR, 4, kPf>;
}

template <Pf kPf>
TileFn tile_for_mr(int mr, int nv) {
  switch (mr) {
    case 1:
      return tile_for_nv<kPf, 1>(nv);
    case 2:
      return tile_for_nv<kPf, 2>(nv);
    case 3:
      return tile_for_nv<kPf, 3>(nv);
    case 4:
      return tile_for_nv<kPf, 4>(nv);
    case 5:
      return tile_for_nv<kPf, 5>(nv);
    default:
      return tile_for_nv<kPf, 6>(nv);
  }
}

// The far streams run only in full tiles (the tail tile of a task's rows does not prefetch).
TileFn tile_for(Pf pf, int mr, int nv) {
  switch (pf) {
    case Pf::kNone:
      return tile_for_mr<Pf::kNone>(mr, nv);
    case Pf::kNear:
      return tile_for_mr<Pf::kNear>(mr, nv);
    case Pf::kFar1:
      return tile_for_nv<Pf::kFar1, kVnniMr>(nv);
    case Pf::kFar2:
      return tile_for_nv<Pf::kFar2, kVnniMr>(nv);
    default:
      return tile_for_nv<Pf::kFar4, kVnniMr>(nv);
  }
}

static_assert(kVnniMr == 6, "tile_for covers MR = 1..6");

// K blocking, for long K only unless args.k_block asks for it. A 6-row tile re-reads its panel
// (64 x K bytes) from L2 for every row tile; up to K = 4096 (256 KiB) that is fast enough and the
// whole K stays in registers. A longer panel no longer fits L2 next to the activations, so it is
// cut into blocks of kVnniLongKBlock that every row of the call shares while the block is in L2,
// with the accumulators parked in acc_scratch (L2) between blocks. Measured on Zen 5 (ratio to
// oneDNN, same run): blocking K = 4096 in 256-deep blocks cost 3-10% at M = 16..256 with the
// weights in cache, so short K is not blocked by default; at K = 14336, M = 1024, 4096-deep
// blocks took the ratio from 0.94 to 0.96-0.97 (2048 and 8192: no better).
constexpr int64_t kVnniLongKBlock = 4096;

// The far stream of 1, 2 or 4 lines a k-step for `lines` needed (4 at most).
Pf far_stream(int64_t lines) { return lines <= 1 ? Pf::kFar1 : lines <= 2 ? Pf::kFar2 : Pf::kFar4; }

}  // namespace

// (avx512_vnni_gemm.h.) Writes finished accumulator rows [m, m + rows) of panel columns [n0, n0 +
// cols): through the epilogue to y, or raw to acc_out.
void finish_vnni_rows(const VnniGemmArgs& g, const int32_t* tile, int64_t m, int64_t rows,
                      int64_t n0, int64_t cols) {
  if (g.acc_out != nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(g.acc_out + (m + r) * g.ld_acc + n0, tile + r * kVnniPanel,
                  static_cast<size_t>(cols) * 4);
    }
  } else {
    epilogue_s32_avx512(g.epi, tile, kVnniPanel, m, rows, n0, cols);
  }
}

void gemm_u8s8_vnni_avx512(const VnniGemmArgs& g, int64_t m_begin, int64_t m_end, int64_t p_begin,
                           int64_t p_end, int32_t* acc) {
  const int64_t ksteps = g.k_pad / 4;
  // A k_block under 4 still moves on, one k-step a block.
  const int64_t block_steps =
      std::max<int64_t>(1, (g.k_block > 0 ? g.k_block : kVnniLongKBlock) / 4);
  const int64_t rows = m_end - m_begin;
  const bool blocked = ksteps > block_steps && rows > kVnniMr;
  const Pf near = g.prefetch_bytes > 0 ? Pf::kNear : Pf::kNone;
  const int64_t full_tiles = rows / kVnniMr;
  auto vectors = [&](int64_t p) {  // 16-column vectors of panel p
    return static_cast<int>(
        g.n_pad - p * kVnniPanel >= kVnniPanel ? 4 : (g.n_pad - p * kVnniPanel) / 16);
  };
  // Blocked, with prefetch_next_block: the full tiles of each block stream the next block into L2
  // between them, each tile a share: this panel's next block or, after its last, the first block of
  // the task's next panel (the panels lie back to back). A block that no stream covered (the
  // task's first, or any whose predecessor's tiles could not cover it) has its first tile
  // prefetch its own weights near instead.
  bool covered = false;
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t n0 = p * kVnniPanel;
    const int nv = vectors(p);
    const int8_t* b = g.packed + n0 * g.k_pad;
    const int64_t b_step = nv * 64;
    const int64_t cols = (g.n - n0) < kVnniPanel ? g.n - n0 : kVnniPanel;
    if (!blocked) {
      for (int64_t m = m_begin; m < m_end; m += kVnniMr) {
        const int mr = static_cast<int>(m_end - m < kVnniMr ? m_end - m : kVnniMr);
        tile_for(near, mr, nv)(g.xu + m * g.ldx, g.ldx, b, b_step, ksteps, g.comp + n0, acc,
                               b + g.prefetch_bytes);
        finish_vnni_rows(g, acc, m, mr, n0, cols);
      }
      continue;
    }
    for (int64_t s0 = 0; s0 < ksteps; s0 += block_steps) {
      const int64_t steps = ksteps - s0 < block_steps ? ksteps - s0 : block_steps;
      const int8_t* next = b + (s0 + steps) * b_step;
      int64_t next_bytes = 0;  // none after the task's last block
      if (s0 + steps < ksteps) {
        next_bytes = std::min(block_steps, ksteps - s0 - steps) * b_step;
      } else if (p + 1 < p_end) {
        next_bytes = std::min(block_steps, ksteps) * vectors(p + 1) * 64;
      }
      const int64_t first_far = g.prefetch_next_block && !covered ? 1 : 0;
      const int64_t far_tiles =
          g.prefetch_next_block && next_bytes > 0 ? full_tiles - first_far : 0;
      const Pf far =
          far_tiles > 0
              ? far_stream((next_bytes + far_tiles * steps * 64 - 1) / (far_tiles * steps * 64))
              : Pf::kNone;
      const int64_t far_step = 64 * far_lines(far);
      for (int64_t m = m_begin; m < m_end; m += kVnniMr) {
        const int mr = static_cast<int>(m_end - m < kVnniMr ? m_end - m : kVnniMr);
        const int64_t tile = (m - m_begin) / kVnniMr;
        Pf pf = Pf::kNone;
        const int8_t* pf_at = nullptr;
        if (!g.prefetch_next_block || (tile == 0 && first_far == 1)) {
          pf = near;
          pf_at = b + s0 * b_step + g.prefetch_bytes;
        } else if (mr == kVnniMr && far != Pf::kNone) {  // far streams run in full tiles only
          const int64_t offset = (tile - first_far) * steps * far_step;
          if (offset < next_bytes) {
            pf = far;
            pf_at = next + offset;
          }
        }
        tile_for(pf, mr, nv)(g.xu + m * g.ldx + 4 * s0, g.ldx, b + s0 * b_step, b_step, steps,
                             s0 == 0 ? g.comp + n0 : nullptr, acc + (m - m_begin) * kVnniPanel,
                             pf_at);
      }
      covered = far_tiles > 0 && far_tiles * steps * far_step >= next_bytes;
    }
    finish_vnni_rows(g, acc, m_begin, m_end - m_begin, n0, cols);
  }
}

}  // namespace qlinear::cpu
