// cuda.cutlass_sm90, tile 16 x 256 x 128 (tokens x channels x K), ping-pong schedule, no cluster,
// operands swapped (TileConfig::kSwapAB): up to 16 tokens on wide layers, the weights' 256
// channels on the MMA's M side (four 64-row instructions per k-step). A k-tile stage holds 32 KB
// of weights and 2 KB of activations: a quarter of the tiles of the 16 x 64 tile, each streaming
// four times the weight rows.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile16x256Swap =
    TileConfig<cute::Shape<cute::_256, cute::_16, cute::_128>,
               cute::Shape<cute::_1, cute::_1, cute::_1>,
               cutlass::gemm::KernelTmaWarpSpecializedPingpong,
               cutlass::epilogue::TmaWarpSpecialized, /*kQuantize=*/false, /*kSwapAB=*/true>;

const TileOps* tile_16x256x128_pingpong_swap(ElemType y) { return tile_ops_for<Tile16x256Swap>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
