// cuda.cutlass_sm90, tile 16 x 64 x 512 (tokens x channels x K), ping-pong schedule, no cluster,
// operands swapped (TileConfig::kSwapAB): up to 16 tokens, the 16 x 64 x 256 tile with k-tiles of
// 512 bytes (a stage of 32 KB of weights and 8 KB of activations, half as many stages).
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile16x64x512Swap =
    TileConfig<cute::Shape<cute::_64, cute::_16, cute::_512>,
               cute::Shape<cute::_1, cute::_1, cute::_1>,
               cutlass::gemm::KernelTmaWarpSpecializedPingpong,
               cutlass::epilogue::TmaWarpSpecialized, /*kQuantize=*/false, /*kSwapAB=*/true>;

const TileOps* tile_16x64x512_pingpong_swap(ElemType y) {
  return tile_ops_for<Tile16x64x512Swap>(y);
}

}  // namespace qlinear::gpu::cutlass_sm90
