// An exact int8 x int8 -> int32 GEMM, one thread per output, for the debug outputs of
// kernels whose fused epilogue never materialises the accumulators (cuda.cutlass_sm90's
// run_debug reports acc from here, on the xq it quantized). Slow and simple on purpose.
//
// Compiled by nvcc and by the host compiler: plain C++ only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace qlinear::gpu {

// acc [m, n] = xq [m, k] x w [n, k]^T (row-major, device pointers). Any shape; returns the
// launch error.
cudaError_t launch_gemm_s8s8_s32_check(const int8_t* xq, const int8_t* w, int64_t m, int64_t n,
                                       int64_t k, int32_t* acc, cudaStream_t stream);

}  // namespace qlinear::gpu
