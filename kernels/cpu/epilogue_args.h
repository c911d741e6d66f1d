// The arguments of the CPU epilogues (SPEC section 4): epilogue_s32_avx512 and
// epilogue_s32_avx2. Generic code: no ISA flags.
#pragma once

#include <cstdint>

#include "kernels/core/dtype.h"
#include "kernels/core/layer.h"

namespace qlinear::cpu {

struct EpilogueArgs {
  Scheme scheme = Scheme::kDynamicSymmetric;
  const float* sb = nullptr;         // [N]
  const float* bias_f = nullptr;     // [N] bias already rounded to y_dtype, or null for no bias
  const int32_t* azp_adj = nullptr;  // [N], asymmetric schemes
  // [N] or null: added (wrapping) to every accumulator first. A GEMM on xq + 128 passes
  // -128 * colsum here to recover the int8 x int8 sums.
  const int32_t* comp = nullptr;
  const float* sa = nullptr;     // [M]; static schemes hold the input scale in every row
  const int32_t* azp = nullptr;  // [M], dynamic asymmetric
  void* y = nullptr;             // [M, ldy] in y_dtype
  DType y_dtype = DType::kBF16;
  int64_t ldy = 0;
};

}  // namespace qlinear::cpu
