// cuda.cutlass_sm90, tile 16 x 64 x 256 (tokens x channels x K), ping-pong schedule, no cluster,
// operands swapped (TileConfig::kSwapAB): up to 16 tokens, the weights' 64 channels on the MMA's
// M side. A k-tile stage holds 16 KB of weights (256 contiguous bytes of each row) and 4 KB of
// activations, where the 64 x 64 tile's holds 8 KB of each (its 64-token block read whole), so the
// pipeline keeps about twice the weight bytes in flight and the activations take an eighth of the
// traffic out of L2.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile16x64x256Swap =
    TileConfig<cute::Shape<cute::_64, cute::_16, cute::_256>,
               cute::Shape<cute::_1, cute::_1, cute::_1>,
               cutlass::gemm::KernelTmaWarpSpecializedPingpong,
               cutlass::epilogue::TmaWarpSpecialized, /*kQuantize=*/false, /*kSwapAB=*/true>;

const TileOps* tile_16x64x256_pingpong_swap(ElemType y) {
  return tile_ops_for<Tile16x64x256Swap>(y);
}

}  // namespace qlinear::gpu::cutlass_sm90
