// cuda.gemv_s8: the whole W8A8 op for small M (decode and small batches, M <= 64) on Hopper, in
// one launch, streaming the weights from their native [N, K] layout at close to HBM bandwidth.
//
// Why: for M <= 64 the op is bound by reading the weights (N*K bytes; 2*M*N*K operations are a
// few percent of the tensor cores' rate), yet cuBLASLt reaches only 1.4-3.5 TB/s of the H200's
// ~4 TB/s there and needs a quantize and an epilogue launch around its GEMM.
//
// How (gemv_s8.cu):
//   - A persistent grid of thread-block clusters, two blocks per SM; each cluster owns a tile of
//     16-128 weight rows at a time and its split_k blocks each stream one K slice of it with
//     16-byte loads straight into registers, two load groups of 2 or 4 64-byte chunks in flight
//     per warp (the first two issued before anything else): up to 128 KB per SM in flight.
//   - Quantization inside the launch: each block reduces its K slice of every activation row,
//     the cluster merges the statistics through distributed shared memory (max/min are exact in
//     any order), and each block quantizes its slice into shared memory with the shared SPEC
//     section 2 code (quantize_s8_device.cuh). Block 0 writes sa/azp (and xq for debug calls).
//   - int8 x int8 -> int32 on the tensor cores (mma.sync m16n8k32, weights as the 16-row A
//     operand, up to 64 tokens as 8-column B blocks): exact.
//   - Split-K without workspace or atomics: partial int32 sums stay in each block's shared
//     memory; after a cluster barrier every thread sums its outputs' partials from all blocks
//     (int32, exact) and applies the SPEC section 4 epilogue in its exact order
//     (epilogue_s32_device.cuh), writing y once.
//   - The split (tile rows, split_k, chunks per load group; clusters from the occupancy) is
//     chosen per layer and M group at load: every split that fits is timed on the layer's own
//     weights with a cold L2 and the fastest kept (gemv_s8_device.h). A cost model alone picked
//     plans up to 1.5x slower than the best on the H200.
//
// Constraints (can_implement): compute capability 9.0 (clusters); K % 16 == 0 and N % 16 == 0
// (whole 16-byte loads and 16-row mma tiles); K <= 131071; 1 <= M <= 64, and M's quantized
// activations must fit in shared memory (for K = 28672 that is M <= 16). Any scheme and dtype.
//
// Per layer (prepare): weights, sb, bias and azp_adj uploaded once; the plans tuned. Per request:
// no allocation and no descriptor; one launch; the serving path synchronises once
// (cuda_host_call.h).
#pragma once

#include <memory>

#include "kernels/core/kernel.h"

namespace qlinear::gpu {

inline constexpr char kGemvS8KernelName[] = "cuda.gemv_s8";

// The prepared object is a gpu::CudaPreparedKernel (cuda_context.h).
std::unique_ptr<Kernel> make_gemv_s8_kernel();

// The kernel's own gate on the device, after the build's architecture check: compute capability
// 9.0 or newer (thread block clusters).
absl::Status gemv_s8_device_gate(const GpuInfo& gpu);

}  // namespace qlinear::gpu
