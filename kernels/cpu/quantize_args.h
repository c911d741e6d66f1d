// The arguments of the CPU activation quantizers (SPEC section 2): quantize_rows_avx512 and
// quantize_rows_avx2. Generic code: no ISA flags.
#pragma once

#include <cstdint>

#include "kernels/core/dtype.h"
#include "kernels/core/layer.h"

namespace qlinear::cpu {

struct QuantizeArgs {
  Scheme scheme = Scheme::kDynamicSymmetric;
  float input_scale = 0.f;       // static schemes
  int32_t input_zero_point = 0;  // static asymmetric
  const void* x = nullptr;       // [M, K] row-major in x_dtype
  DType x_dtype = DType::kBF16;
  int64_t k = 0;
  // Output rows: xq[m * xq_stride + i] for i < K; bytes [K, xq_stride) of each row are written
  // with the zero of the encoding. xq_stride >= K.
  int8_t* xq = nullptr;
  int64_t xq_stride = 0;
  // When true (quantize_rows_avx512 only), xq is laid out in tiles of 16 rows x 64 bytes, the AMX
  // GEMM's A operand (amx_gemm.h): bytes [64 j, 64 j + 64) of row r at xq + (r / 16) * 16 *
  // xq_stride + j * 1024 + (r % 16) * 64. xq_stride must be a multiple of 64, and xq hold
  // round_up(M, 16) * xq_stride bytes.
  bool xq_tiles = false;
  // When true, xq holds xq + 128 as uint8 (the unsigned operand of VPDPBUSD) instead of int8.
  bool shift_to_u8 = false;
  float* sa = nullptr;     // [M]
  int32_t* azp = nullptr;  // [M], asymmetric schemes only (may be null otherwise)
};

}  // namespace qlinear::cpu
