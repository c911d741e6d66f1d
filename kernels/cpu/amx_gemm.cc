#include "kernels/cpu/amx_gemm.h"

#include <immintrin.h>

#include <algorithm>

namespace qlinear::cpu {
namespace {

// The tile configuration's memory form (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Two layouts, every tile 64 bytes wide:
//   pair: tiles 0-1 the C tiles of the first row tile (`ra` rows) and two vectors, 2-3 those of
//     the second row tile (`rb` rows), 4 and 5 the row tiles' A tiles, 6-7 the vectors' B tiles;
//   quad (one row tile): tiles 0-3 the C tiles of a panel's 4 vectors, 4 the A tile (`ra` rows),
//     5-7 B tiles in turn.
void configure(bool pair, int64_t ra, int64_t rb) {
  TileConfig c;
  const int64_t rows[8] = {ra, ra, pair ? rb : ra, pair ? rb : ra, ra, pair ? rb : 16, 16, 16};
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = static_cast<uint8_t>(rows[t]);
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

constexpr int64_t kCStride = kVnniPanel * 4;  // bytes between rows of the C scratch
constexpr int64_t kATileBytes = kAmxRows * kAmxKStep;

// The next panel's weights, prefetched into L2 while this panel is multiplied: per_tile cache
// lines at each tile step. On a 16-core Xeon with AMX (16 threads), without the prefetch the GEMM
// took 4-8% longer at M = 64-1024 in one run and moved within the noise in another; with
// _MM_HINT_T1 instead of T2 (both fetch into L2 on these cores) it took 1-20% longer in both.
struct NextPanel {
  const char* next = nullptr;
  const char* end = nullptr;
  int64_t per_tile = 0;
  void step() {
    for (int64_t i = 0; i < per_tile && next < end; ++i, next += 64) {
      _mm_prefetch(next, _MM_HINT_T2);
    }
  }
};

// Pair layout: NV (1 or 2) vectors from b (the first vector's bytes at the block's first k-step,
// b_step the panel's bytes per k-step) for two row tiles of xu (their A tiles at a0 and a1 for
// the block's first tile of K) over kt tiles of K. The C tiles start from init (the first vector's
// comp, in every row: a tile load with a row stride of 0) in K's first block, else from c (the
// first row tile's) and c + 16 rows, and end there.
template <int NV>
void pair_tiles(const uint8_t* a0, const uint8_t* a1, const int8_t* b, int64_t b_step, int64_t kt,
                const int32_t* init, int32_t* c, NextPanel& pf) {
  int32_t* c1 = c + kAmxRows * kVnniPanel;
  const int32_t* s0 = init != nullptr ? init : c;
  const int32_t* s1 = init != nullptr ? init : c1;
  const int64_t stride = init != nullptr ? 0 : kCStride;
  _tile_loadd(0, s0, stride);
  _tile_loadd(2, s1, stride);
  if constexpr (NV > 1) {
    _tile_loadd(1, s0 + 16, stride);
    _tile_loadd(3, s1 + 16, stride);
  }
  for (int64_t t = 0; t < kt; ++t) {
    const int8_t* bt = b + t * 16 * b_step;
    pf.step();
    _tile_loadd(4, a0 + t * kATileBytes, kAmxKStep);
    _tile_loadd(6, bt, b_step);
    _tile_dpbusd(0, 4, 6);
    _tile_loadd(5, a1 + t * kATileBytes, kAmxKStep);
    _tile_dpbusd(2, 5, 6);
    if constexpr (NV > 1) {
      _tile_loadd(7, bt + 64, b_step);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(3, 5, 7);
    }
  }
  _tile_stored(0, c, kCStride);
  _tile_stored(2, c1, kCStride);
  if constexpr (NV > 1) {
    _tile_stored(1, c + 16, kCStride);
    _tile_stored(3, c1 + 16, kCStride);
  }
}

// Quad layout: a panel's NV vectors (b as above) for one row tile (its A tile at a), C from init
// (the panel's comp) or c as above.
// With `stream` (the panel comes from memory), each tile step prefetches the panel's bytes of the
// tile of K two steps ahead into L1: on a 16-core Xeon with AMX this took the GEMM at M = 1-16
// from 0.226-0.243 to 0.179-0.198 ms on 6144 x 4096, 0.824-1.067 to 0.661-0.679 on 28672 x 4096
// and 0.391-0.413 to 0.327-0.344 on 4096 x 14336 (medians in turns; one tile step ahead or
// four measured alike, eight slower, and T2 instead of T0 up to 11% slower).
template <int NV>
void quad_tiles(const uint8_t* a, const int8_t* b, int64_t b_step, int64_t kt, const int32_t* init,
                int32_t* c, NextPanel& pf, bool stream) {
  const int64_t tile_bytes = 16 * b_step;  // the panel's bytes per tile of K
  const int32_t* s = init != nullptr ? init : c;
  const int64_t stride = init != nullptr ? 0 : kCStride;
  _tile_loadd(0, s, stride);
  if constexpr (NV > 1) _tile_loadd(1, s + 16, stride);
  if constexpr (NV > 2) _tile_loadd(2, s + 32, stride);
  if constexpr (NV > 3) _tile_loadd(3, s + 48, stride);
  for (int64_t t = 0; t < kt; ++t) {
    const int8_t* bt = b + t * tile_bytes;
    pf.step();
    if (stream) {
      const char* ahead = reinterpret_cast<const char*>(bt) + 2 * tile_bytes;
      for (int64_t i = 0; i < tile_bytes; i += 64) _mm_prefetch(ahead + i, _MM_HINT_T0);
    }
    _tile_loadd(4, a + t * kATileBytes, kAmxKStep);
    _tile_loadd(5, bt, b_step);
    _tile_dpbusd(0, 4, 5);
    if constexpr (NV > 1) {
      _tile_loadd(6, bt + 64, b_step);
      _tile_dpbusd(1, 4, 6);
    }
    if constexpr (NV > 2) {
      _tile_loadd(7, bt + 128, b_step);
      _tile_dpbusd(2, 4, 7);
    }
    if constexpr (NV > 3) {
      _tile_loadd(5, bt + 192, b_step);
      _tile_dpbusd(3, 4, 5);
    }
  }
  _tile_stored(0, c, kCStride);
  if constexpr (NV > 1) _tile_stored(1, c + 16, kCStride);
  if constexpr (NV > 2) _tile_stored(2, c + 32, kCStride);
  if constexpr (NV > 3) _tile_stored(3, c + 48, kCStride);
}

}  // namespace

void gemm_u8s8_amx(const VnniGemmArgs& g, int64_t m_begin, int64_t m_end, int64_t p_begin,
                   int64_t p_end, int32_t* c) {
  const int64_t k_tiles = g.k_pad / kAmxKStep;
  constexpr int64_t kBlockTiles = kAmxKBlock / kAmxKStep;
  constexpr int64_t kPairRows = 2 * kAmxRows;
  int64_t configured = -1;  // the tiles' configuration: (pair, ra, rb)
  auto configure_for = [&](bool pair, int64_t ra, int64_t rb) {
    const int64_t key = (pair ? int64_t{1} << 16 : 0) | ra << 8 | rb;
    if (key != configured) {
      configure(pair, ra, rb);
      configured = key;
    }
  };
  for (int64_t mb = m_begin; mb < m_end; mb += kAmxRowBlock) {
    const int64_t mb_end = std::min(m_end, mb + kAmxRowBlock);
    const int64_t rows = mb_end - mb;
    // Below kAmxReuseRows rows a panel streams from memory as it is multiplied: the block's first
    // row tile goes alone over the panel's 4 vectors (each k-step's bytes read whole and in
    // order), and the next panel is not prefetched.
    const bool streamed = rows < kAmxReuseRows;
    auto group_rows = [&](int64_t m) {
      return std::min(streamed && m == mb ? kAmxRows : kPairRows, mb_end - m);
    };
    for (int64_t p = p_begin; p < p_end; ++p) {
      const int64_t n0 = p * kVnniPanel;
      const int64_t panel_cols = std::min<int64_t>(kVnniPanel, g.n_pad - n0);
      const int nv = static_cast<int>(panel_cols / 16);
      const int64_t cols = std::min<int64_t>(panel_cols, g.n - n0);  // columns this call writes
      const int8_t* panel = g.packed + n0 * g.k_pad;
      const int64_t b_step = 4 * panel_cols;
      // The panel after this one (or the first again, for the next row block), spread over this
      // panel's tile steps: one per two vectors in a row pair, one in a lone row tile.
      NextPanel pf;
      const int64_t next = p + 1 < p_end ? p + 1 : (mb_end < m_end ? p_begin : -1);
      if (next >= 0 && !streamed) {
        int64_t steps = 0;
        for (int64_t m = mb; m < mb_end; m += group_rows(m)) {
          steps += k_tiles * (group_rows(m) > kAmxRows ? (nv + 1) / 2 : 1);
        }
        const int64_t next_bytes =
            std::min<int64_t>(kVnniPanel, g.n_pad - next * kVnniPanel) * g.k_pad;
        pf.next = reinterpret_cast<const char*>(g.packed + next * kVnniPanel * g.k_pad);
        pf.end = pf.next + next_bytes;
        pf.per_tile = (next_bytes / 64 + steps - 1) / steps;
      }
      for (int64_t t0 = 0; t0 < k_tiles; t0 += kBlockTiles) {
        const int64_t kt = std::min(kBlockTiles, k_tiles - t0);
        // K's first block starts from comp: the sums of xq + 128 back to those of xq (wrapping).
        const int32_t* comp = t0 == 0 ? g.comp + n0 : nullptr;
        const int8_t* b = panel + t0 * 16 * b_step;
        for (int64_t m = mb; m < mb_end; m += group_rows(m)) {
          const int64_t r = group_rows(m);
          const uint8_t* a = g.xu + m * g.ldx + t0 * kATileBytes;  // m is a multiple of 16
          int32_t* cm = c + (m - mb) * kVnniPanel;
          if (r > kAmxRows) {
            configure_for(true, kAmxRows, r - kAmxRows);
            const uint8_t* a1 = a + kAmxRows * g.ldx;
            for (int v = 0; v < nv; v += 2) {
              if (nv - v >= 2) {
                pair_tiles<2>(a, a1, b + 64 * v, b_step, kt,
                              comp != nullptr ? comp + 16 * v : nullptr, cm + 16 * v, pf);
              } else {
                pair_tiles<1>(a, a1, b + 64 * v, b_step, kt,
                              comp != nullptr ? comp + 16 * v : nullptr, cm + 16 * v, pf);
              }
            }
          } else {
            configure_for(false, r, 0);
            switch (nv) {
              case 1:
                quad_tiles<1>(a, b, b_step, kt, comp, cm, pf, streamed && m == mb);
                break;
              case 2:
                quad_tiles<2>(a, b, b_step, kt, comp, cm, pf, streamed && m == mb);
                break;
              case 3:
                quad_tiles<3>(a, b, b_step, kt, comp, cm, pf, streamed && m == mb);
                break;
              default:
                quad_tiles<4>(a, b, b_step, kt, comp, cm, pf, streamed && m == mb);
                break;
            }
          }
        }
      }
      finish_vnni_rows(g, c, mb, rows, n0, cols);
    }
  }
  if (configured >= 0) _tile_release();
}

}  // namespace qlinear::cpu
