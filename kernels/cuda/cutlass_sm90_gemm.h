// cuda.cutlass_sm90: the W8A8 op for medium and large M on Hopper, as cuda.quantize followed by a
// CUTLASS 3.x TMA warp-specialized int8 GEMM (wgmma) whose epilogue applies SPEC section 4 on the
// accumulators and writes y once, in bf16, fp16 or fp32.
//
// Why: cuBLASLt's int8 GEMM can only write int32, so the separate dequantization pass reads and
// writes M*N*(4 + 2) more bytes: 22-27% of the time at large M on the H200.
//
// Bit-exactness: the epilogue is an epilogue visitor tree of functors that spell every rounding
// (cutlass_sm90_gemm.cuh), so y is bit-exact with the reference, as is everything else: xq, sa
// and azp come from cuda.quantize, acc is exact int32. One form serves every scheme:
//   y = out(fma(sa[m], sb[n] * f32(acc - azp[m] * colsum[n]), bias_v[n]))
// with the quantizer's azp (the dynamic zero point, or the static one, where azp * colsum is the
// folded azp_adj; symmetric layers have no such term, and their epilogue reads neither azp nor
// colsum), and bias_v = bias_f, or +0 for asymmetric and -0 for
// symmetric layers without bias (fma(a, b, -0) is exactly a * b, as the SPEC's symmetric row).
//
// Tile configurations (one translation unit each): each layer times them on its own weights at
// load for M = 1, 16, 64, 128, 256, 1024, 2048, 4096 and 8192 while each operand fits 256 MB, and
// keeps the fastest per M (tune_tiles in cutlass_sm90_gemm.cc). A call of M tokens takes the
// choice at the smallest of those M at or above its own; where that one was not timed, the choice
// at the largest M timed from 2048 on; failing both, rules measured on the Llama-3 shapes
// (tile_for, with the table behind them).
//
// Constraints (can_implement): compute capability 9.0 exactly (sm_90a code), the CUTLASS headers
// found at configure time ("not compiled in" otherwise), K % 16 == 0 and N % 16 == 0 (TMA needs
// 16-byte rows), K <= 131071, M < 2^31. Any scheme and dtype.
//
// Per layer (prepare): weights, sb, column sums and bias_v for each output type uploaded once;
// kernels' shared-memory limits set. Per request: two launches (quantize, fused GEMM), no
// allocation; kernel parameters (TMA descriptors) are encoded on the host. Up to M = 64 the GEMM
// is launched as the quantize kernel's programmatic dependent (PDL): the quantize kernel lets it
// start at once, so its launch and set-up (barriers, descriptor prefetch) overlap the
// quantization, and its producer warp, after starting the L2 prefetch of its first 64 KB of
// weights, waits on the grid dependency (griddepcontrol.wait, in the mainloop:
// cutlass_sm90_dependent_mainloop.cuh) before it loads xq; everything it reads later (sa, azp)
// follows that wait. Beyond M = 64 only the tiles with a cluster are launched so: up to M = 128,
// and while the tile's token blocks fit in one cluster (the 128 x 128 tile up to M = 256); the
// others measured slower with it (the numbers are beside kPdlMaxM and kPdlClusterMaxM in
// cutlass_sm90_gemm.cc). Where each weight tile is read once (its token blocks within one
// cluster) the weights' loads carry an evict-first L2 hint (kWeightsEvictFirst).
#pragma once

#include <memory>

#include "kernels/core/kernel.h"

namespace qlinear::gpu {

inline constexpr char kCutlassSm90KernelName[] = "cuda.cutlass_sm90";

// Always available; when the binary was built without the CUTLASS headers or without sm_90a,
// is_supported says so. The prepared object is a gpu::CudaPreparedKernel (cuda_context.h).
std::unique_ptr<Kernel> make_cutlass_sm90_kernel();

// The kernel's own gate on the device, after the build's architecture check (which, in a build
// for "native" or "all" architectures, lets any device through): compute capability 9.0 only, as
// wgmma is sm_90a's (a Blackwell device, sm_100, is refused).
absl::Status cutlass_sm90_device_gate(const GpuInfo& gpu);

// Whether this binary holds the CUTLASS kernels.
bool cutlass_sm90_compiled_in();

// Every cuda.cutlass_sm90 call takes this tile (a CutlassSm90Tile among those a layer times at
// load) instead of its layer's choice, where the tile takes the layer's shape at the call's M (a
// call whose x tile 15 cannot read runs the layer's fastest other tile); -1 (the default), or a
// tile a layer does not time, gives the layers' choices back. Process-wide, for tests of a tile's
// serving path; a small call already captured in a CUDA graph keeps the tile it was captured
// with.
void set_cutlass_sm90_forced_tile(int tile);

// How many of this process's tile timings (a layer's load, up to kRotateMaxM) ran over copies of
// the layer's weights rather than cold; for tests of when the copies are made.
int64_t cutlass_sm90_timings_over_copies();

}  // namespace qlinear::gpu
