// The device half of cuda.cutlass_sm90 (see cutlass_sm90_gemm.h): a CUTLASS 3.x Hopper TMA
// warp-specialized int8 GEMM whose epilogue applies SPEC section 4 on the accumulators.
//
// Compiled by nvcc and by the host compiler: plain C++ only (see quantize_s8.h). Defined only
// when the CUTLASS headers were found at configure time (QLINEAR_HAVE_CUTLASS).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/quantize_s8.h"

namespace qlinear::gpu {

// The tile configurations compiled in; which one serves which M is the ladder in
// cutlass_sm90_gemm.cc.
enum class CutlassSm90Tile : int {
  k64x128x128Pingpong = 0,   // 64 tokens x 128 channels, one warpgroup per tile
  k128x128x128Pingpong = 1,  // 128 x 128, two consumer warpgroups taking turns
  k128x256x128Coop = 2,      // 128 x 256, two warpgroups on one tile, cluster 2x1
  k64x64x128Pingpong = 3,    // 64 x 64, one warpgroup per tile: few tokens on narrow layers
  k64x256x128Pingpong = 4,   // 64 x 256, one warpgroup per tile: few tokens on wide layers
};
inline constexpr int kCutlassSm90Tiles = 5;

// One fused GEMM: y[m, n] = out(fma(sa[m], sb[n] * f32(acc[m, n] - azp[m] * adj[n]), bias_v[n]))
// with acc = xq [m, k] (row-major) x w [n, k]^T, int32 arithmetic wrapping. With azp = the
// quantizer's output (0 for symmetric schemes, the zero point for static asymmetric) and
// adj = the weights' column sums, this is every row of SPEC section 4 in its exact order;
// bias_v is bias_f, or +0 (asymmetric) / -0 (symmetric, where fma(a, b, -0) = a * b exactly) when
// the layer has none. Device pointers; k % 16 == 0, n % 16 == 0.
struct CutlassSm90Args {
  const int8_t* xq = nullptr;
  const int8_t* w = nullptr;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  const float* sa = nullptr;
  const int32_t* azp = nullptr;
  const float* sb = nullptr;
  const int32_t* adj = nullptr;
  const float* bias_v = nullptr;
  void* y = nullptr;
  ElemType y_type = ElemType::kBF16;
  int sm_count = 0;
  // Launch as the programmatic dependent of the stream's previous kernel (which must trigger
  // griddepcontrol.launch_dependents, as the quantize kernel does): the GEMM's set-up overlaps
  // that kernel, and its producer waits for that kernel's results before the first load.
  bool pdl = false;
};

namespace cutlass_sm90 {

// What one tile configuration offers for one output type. Each configuration is compiled in its
// own translation unit (cutlass_sm90_tile_*.cu) so that the slow CUTLASS compilations run in
// parallel.
struct TileOps {
  // Raises the kernel's shared memory limit (once); cudaSuccess or the error.
  cudaError_t (*prepare)();
  // Bytes of workspace for this problem (256-byte aligned pointer); 0 for the data-parallel
  // persistent scheduler used here.
  size_t (*workspace_bytes)(const CutlassSm90Args&);
  // Whether CUTLASS accepts the problem (alignment, sizes).
  bool (*can_implement)(const CutlassSm90Args&);
  // Enqueues the fused GEMM: the kernel parameters (TMA descriptors included) are encoded on
  // the host, with no allocation and no call into the driver but the launch. Returns
  // cudaErrorInvalidValue when CUTLASS rejects the problem, else the launch error.
  cudaError_t (*launch)(const CutlassSm90Args&, void* workspace, cudaStream_t);
};

// The entry points of one configuration for output type y (null for an unknown type).
const TileOps* tile_64x128x128_pingpong(ElemType y);
const TileOps* tile_128x128x128_pingpong(ElemType y);
const TileOps* tile_128x256x128_coop(ElemType y);
const TileOps* tile_64x64x128_pingpong(ElemType y);
const TileOps* tile_64x256x128_pingpong(ElemType y);

inline const TileOps* tile_ops(CutlassSm90Tile tile, ElemType y) {
  switch (tile) {
    case CutlassSm90Tile::k64x128x128Pingpong:
      return tile_64x128x128_pingpong(y);
    case CutlassSm90Tile::k128x128x128Pingpong:
      return tile_128x128x128_pingpong(y);
    case CutlassSm90Tile::k128x256x128Coop:
      return tile_128x256x128_coop(y);
    case CutlassSm90Tile::k64x64x128Pingpong:
      return tile_64x64x128_pingpong(y);
    case CutlassSm90Tile::k64x256x128Pingpong:
      return tile_64x256x128_pingpong(y);
  }
  return nullptr;
}

}  // namespace cutlass_sm90
}  // namespace qlinear::gpu
