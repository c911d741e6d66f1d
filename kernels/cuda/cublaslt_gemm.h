// cuda.cublaslt: the W8A8 op on any NVIDIA GPU this binary has code for, through cuBLASLt.
//
//   1. cuda.quantize (quantize_s8.h): x -> xq int8, sa, azp, with the non-finite check.
//   2. cuBLASLt int8 TN GEMM on the native [N, K] weights, no transpose: in column-major terms
//      C^T[N, M] = W[N, K] * X^T, i.e. A = W as a K x N column-major matrix used with op T,
//      B = xq as K x M column-major with op N, C = int32 N x M column-major, which is exactly
//      acc [M, N] row-major.
//   3. The SPEC section 4 epilogue as a separate kernel (epilogue_s32.h): bit-exact with the
//      reference, since cuBLASLt's own epilogues cannot keep the section's operation order.
//
// Constraints (can_implement): K % 4 == 0 and N % 4 == 0 (cuBLASLt int8 alignment), K <= 131071;
// any M, scheme and dtype. The kernel is the universal GPU fallback: it prefers every M.
//
// Per layer (prepare): weights, sb, bias and azp_adj uploaded once; a cuBLASLt handle, the matmul
// descriptor, the weight layout and one algorithm per M range chosen by cuBLASLt's heuristic.
// Per request: a stream context from the process-wide pool (kernels/cuda/cuda_context.h) whose
// grown buffers, pinned staging and cuBLASLt workspace are reused; one synchronisation at the
// end. The workspace lives with the stream context rather than the layer because two requests
// on one layer run concurrently on different streams and must not share it.
#pragma once

#include <memory>

#include "kernels/core/kernel.h"

namespace qlinear::gpu {

inline constexpr char kCublasLtKernelName[] = "cuda.cublaslt";

// The prepared object is a gpu::CudaPreparedKernel (cuda_context.h).
std::unique_ptr<Kernel> make_cublaslt_kernel();

}  // namespace qlinear::gpu
