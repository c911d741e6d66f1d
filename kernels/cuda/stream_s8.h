// cuda.stream_s8: the W8A8 op for small M (decode and small batches, M <= 32) on Hopper, streaming
// the weights from their native [N, K] layout at HBM bandwidth with no start-up gap.
//
// Why: at M <= 16 the op is bound by reading the weights once, and what separates a kernel from
// the read's time is how soon its weight stream starts and how evenly it ends. cuBLASLt and the
// CUTLASS kernel wait for the quantized activations before their first weight load, and their
// output tiles divide unevenly among the 132 SMs on layers like 28672 x 4096 (112 or 224 tiles of
// 256 or 128 rows) and 8192 x 28672 (64 or 128 tiles); cuda.gemv_s8 quantizes inside its launch,
// and its weight stream waits behind that.
//
// How (stream_s8.cu):
//   - A few short rows of 16-bit activations (M <= 8, M * K <= 32768: decode on every layer with
//     K <= 32768) are quantized inside the one launch: each block's producer warp copies the raw
//     rows into shared memory and then streams the weights, while the consumer warps and four
//     helper warps gather the rows' statistics and quantize them there with the quantize
//     kernel's device code (block 0 writes sa and azp for the caller). No quantize kernel and no
//     grid dependency: up to 1.6 us less than the two launches at M = 1 on the H200 benchmark's
//     layers. This form's ring is timed per layer at load: 2 slots, or 3 with 0, 2, 4 or 8 units
//     past them prefetched into L2 at each block's start, so that DRAM keeps streaming while the
//     full ring waits for the quantized rows (1-6 us on the largest layers).
//   - Otherwise two launches: the quantize kernel (cuda.quantize, which also zeroes this call's
//     counters), then this kernel as its programmatic dependent. Each block's producer warp
//     issues its first weight copies before griddepcontrol.wait, so the weights stream while the
//     activations are quantized; the activations' copies follow the wait. On layers larger than
//     the L2, how many ring slots it fills first and how many units after them it prefetches into
//     L2 is timed at load (at M = 16); smaller layers fill the whole ring.
//   - TMA loads of the weights (boxes of 64 rows x 128 bytes, 128-byte swizzle, evict-first in
//     L2, each L2 fetch promoted to 128 bytes) and one bulk copy per slot of every token's
//     512-byte slice of the activations, into a ring of 3 slots (2 where the one-launch form's
//     timing picks them) of 64 rows x 512 bytes (more slots measured no faster).
//   - Stream-K-like division: the layer's units (64 rows x 512 bytes of K) are cut into equal
//     contiguous ranges, one per SM, so each SM streams long runs of the same rows; a row block
//     shared by neighbouring ranges is reduced by its owner, the block holding its last unit
//     (int32 partials, exact; a release counter per row block and warp, so each warp finishes its
//     own rows; in the one-launch form, which has no quantize kernel to zero counters, a release
//     flag per block and warp that the owner sets back to zero). Each block takes its range as
//     tail, whole row blocks, head: its partial sums
//     are published first and it adds the earlier blocks' last, so the kernel ends with plain
//     epilogues and no atomic round trip (1-2 us faster than the last block to finish a row
//     block reducing it).
//   - int8 x int8 -> int32 on the tensor cores (mma.sync m16n8k32, ldmatrix from the ring; the
//     weights are the 16-row A operand, up to 32 tokens as 8-column B blocks): exact.
//   - The SPEC section 4 epilogue in its exact order (epilogue_s32_device.cuh), y written once.
//
// Constraints (can_implement): compute capability 9.0 (bulk copies, programmatic launch);
// K % 16 == 0 and N % 16 == 0 (16-byte copies, 16-row mma tiles); K <= kMaxK; 1 <= M <= 32. Any
// scheme and dtype.
//
// Per layer (prepare): weights, sb, bias and azp_adj uploaded once (shared with the layer's other
// CUDA kernels) and the weights' TMA descriptor made. Per request: no allocation and no
// descriptor; one or two launches; the serving path synchronises once (cuda_host_call.h).
#pragma once

#include <memory>

#include "kernels/core/kernel.h"

namespace qlinear::gpu {

inline constexpr char kStreamS8KernelName[] = "cuda.stream_s8";

// The prepared object is a gpu::CudaPreparedKernel (cuda_context.h).
std::unique_ptr<Kernel> make_stream_s8_kernel();

// The kernel's own gate on the device, after the build's architecture check: compute capability
// 9.0 or newer (bulk copies, programmatic launches).
absl::Status stream_s8_device_gate(const GpuInfo& gpu);

}  // namespace qlinear::gpu
