// cuda.cutlass_sm90, tile 16 x 64 x 256 (tokens x channels x K), ping-pong schedule, no cluster,
// operands swapped, K split (TileConfig::kSplitK): the 16 x 64 x 256 swapped tile with K cut into
// CutlassSm90Args::splits slices, each its own CTA tile, their sums met in the epilogue
// (cutlass_sm90_split_k.cuh). A layer of 4096 channels then gives `splits` times its 64 tiles.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile16x64x256SwapSplitK =
    TileConfig<cute::Shape<cute::_64, cute::_16, cute::_256>,
               cute::Shape<cute::_1, cute::_1, cute::_1>,
               cutlass::gemm::KernelTmaWarpSpecializedPingpong,
               cutlass::epilogue::TmaWarpSpecialized, /*kQuantize=*/false, /*kSwapAB=*/true,
               /*kSplitK=*/true>;

const TileOps* tile_16x64x256_pingpong_swap_split_k(ElemType y) {
  return tile_ops_for<Tile16x64x256SwapSplitK>(y);
}

}  // namespace qlinear::gpu::cutlass_sm90
