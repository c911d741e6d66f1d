#include "bench/cpu/roofline_amx.h"

#include <immintrin.h>

namespace qlinear::bench {

uint64_t tdpbusd_loop_amx(int64_t iterations) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
  // A and B: two tiles each of zeros (the rate does not depend on the values).
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  alignas(64) int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return static_cast<uint64_t>(out[0]) + static_cast<uint64_t>(iterations);
}

}  // namespace qlinear::bench
