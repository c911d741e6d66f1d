#include "kernels/cpu/amx_gemm.h"

#include <immintrin.h>

#include <algorithm>

namespace qlinear::cpu {
namespace {

// The tile configuration's memory form (palette 1): tiles 0-3 the C tiles of the panel's vectors,
// tile 4 the A tile, tiles 5-7 the B tiles in turn.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure(int64_t rows) {
  TileConfig c;
  for (int t = 0; t < 5; ++t) {  // C and A: `rows` rows of 64 bytes
    c.rows[t] = static_cast<uint8_t>(rows);
    c.colsb[t] = 64;
  }
  for (int t = 5; t < 8; ++t) {  // B: 16 k-steps of 64 bytes
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// NV vectors of one panel for the configured rows of xu (a, row stride lda) over k_pad / 64 tiles
// of K; b: the panel, b_step its bytes per k-step. The C tiles end in c_out [rows][kVnniPanel].
template <int NV>
void panel_tiles(const uint8_t* a, int64_t lda, const int8_t* b, int64_t b_step, int64_t k_tiles,
                 int32_t* c_out) {
  _tile_zero(0);
  if constexpr (NV > 1) _tile_zero(1);
  if constexpr (NV > 2) _tile_zero(2);
  if constexpr (NV > 3) _tile_zero(3);
  for (int64_t t = 0; t < k_tiles; ++t) {
    const int8_t* bt = b + t * 16 * b_step;
    _tile_loadd(4, a + t * kAmxKStep, lda);
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
  constexpr int64_t kStride = kVnniPanel * 4;
  _tile_stored(0, c_out, kStride);
  if constexpr (NV > 1) _tile_stored(1, c_out + 16, kStride);
  if constexpr (NV > 2) _tile_stored(2, c_out + 32, kStride);
  if constexpr (NV > 3) _tile_stored(3, c_out + 48, kStride);
}

}  // namespace

void gemm_u8s8_amx(const VnniGemmArgs& g, int64_t m_begin, int64_t m_end, int64_t p_begin,
                   int64_t p_end, int32_t* tile) {
  const int64_t k_tiles = g.k_pad / kAmxKStep;
  int64_t configured = 0;
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t n0 = p * kVnniPanel;
    const int64_t panel_cols = std::min<int64_t>(kVnniPanel, g.n_pad - n0);
    const int nv = static_cast<int>(panel_cols / 16);
    const int64_t cols = std::min<int64_t>(panel_cols, g.n - n0);  // columns this call writes
    const int8_t* panel = g.packed + n0 * g.k_pad;
    const int64_t b_step = 4 * panel_cols;
    for (int64_t m = m_begin; m < m_end; m += kAmxRows) {
      const int64_t rows = std::min<int64_t>(kAmxRows, m_end - m);
      if (rows != configured) {
        configure(rows);
        configured = rows;
      }
      const uint8_t* a = g.xu + m * g.ldx;
      switch (nv) {
        case 1:
          panel_tiles<1>(a, g.ldx, panel, b_step, k_tiles, tile);
          break;
        case 2:
          panel_tiles<2>(a, g.ldx, panel, b_step, k_tiles, tile);
          break;
        case 3:
          panel_tiles<3>(a, g.ldx, panel, b_step, k_tiles, tile);
          break;
        default:
          panel_tiles<4>(a, g.ldx, panel, b_step, k_tiles, tile);
          break;
      }
      // The sums of xq + 128 back to those of xq: comp added (wrapping) to every row.
      for (int v = 0; v < nv; ++v) {
        const __m512i c = _mm512_loadu_si512(g.comp + n0 + 16 * v);
        for (int64_t r = 0; r < rows; ++r) {
          int32_t* t = tile + r * kVnniPanel + 16 * v;
          _mm512_store_si512(t, _mm512_add_epi32(_mm512_load_si512(t), c));
        }
      }
      finish_vnni_rows(g, tile, m, rows, n0, cols);
    }
  }
  if (configured != 0) _tile_release();
}

}  // namespace qlinear::cpu
