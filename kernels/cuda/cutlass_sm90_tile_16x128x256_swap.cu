// cuda.cutlass_sm90, tile 16 x 128 x 256 (tokens x channels x K), ping-pong schedule, no cluster,
// operands swapped (TileConfig::kSwapAB): up to 16 tokens, each tile streams twice the weight rows
// of the 16 x 64 tiles per k-step (half the tiles: 224 on 28672 channels).
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile16x128x256Swap =
    TileConfig<cute::Shape<cute::_128, cute::_16, cute::_256>,
               cute::Shape<cute::_1, cute::_1, cute::_1>,
               cutlass::gemm::KernelTmaWarpSpecializedPingpong,
               cutlass::epilogue::TmaWarpSpecialized, /*kQuantize=*/false, /*kSwapAB=*/true>;

const TileOps* tile_16x128x256_pingpong_swap(ElemType y) {
  return tile_ops_for<Tile16x128x256Swap>(y);
}

}  // namespace qlinear::gpu::cutlass_sm90
