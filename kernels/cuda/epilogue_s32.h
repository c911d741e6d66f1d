// The dequantization epilogue of SPEC section 4 as one CUDA kernel: int32 acc -> y in fp32, fp16
// or bf16, in exactly the section's operation order, so it is bit-exact with
// reference::epilogue. GEMM kernels whose library cannot express that order (cuBLASLt) run
// their GEMM with int32 output and then this.
//
// Compiled by nvcc and by the host compiler: plain C++ only (see quantize_s8.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/quantize_s8.h"

namespace qlinear::gpu {

// Device pointers. acc [m, n] int32 row-major; sa [m] (per row; static schemes repeat their
// scale); azp [m] (dynamic asymmetric only); sb [n]; azp_adj [n] (asymmetric schemes only);
// bias [n] fp32 or null (rounded to y's type in the kernel, as the SPEC says).
struct EpilogueArgs {
  const int32_t* acc = nullptr;
  int64_t m = 0;
  int64_t n = 0;
  QuantScheme scheme = QuantScheme::kDynamicSymmetric;
  const float* sa = nullptr;
  const int32_t* azp = nullptr;
  const float* sb = nullptr;
  const int32_t* azp_adj = nullptr;
  const float* bias = nullptr;
  void* y = nullptr;  // [m, n] row-major
  ElemType y_type = ElemType::kBF16;
};

// Enqueues the epilogue on `stream`. Any m, n >= 1 (4-wide vector path when n % 4 == 0 and the
// pointers allow it). Returns the launch error, if any.
cudaError_t launch_epilogue_s32(const EpilogueArgs& args, cudaStream_t stream);

}  // namespace qlinear::gpu
