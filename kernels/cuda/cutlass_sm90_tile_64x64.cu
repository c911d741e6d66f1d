// cuda.cutlass_sm90, tile 64 x 64 x 128 (tokens x channels x K), ping-pong schedule, no cluster:
// for few tokens on narrow layers, where 64 x 128 tiles would leave SMs idle (N = 4096 has 32
// of them per 64 tokens for 132 SMs); twice the tiles, each SM streaming half the weight rows.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile64x64 = TileConfig<
    cute::Shape<cute::_64, cute::_64, cute::_128>, cute::Shape<cute::_1, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized>;

const TileOps* tile_64x64x128_pingpong(ElemType y) { return tile_ops_for<Tile64x64>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
