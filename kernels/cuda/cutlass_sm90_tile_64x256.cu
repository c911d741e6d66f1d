// cuda.cutlass_sm90, tile 64 x 256 x 128 (tokens x channels x K), ping-pong schedule, no cluster:
// few tokens on wide layers, where each tile streams twice the weight rows of a 64 x 128 tile per
// K step (more bytes in flight per SM, half the tiles).
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile64x256 = TileConfig<
    cute::Shape<cute::_64, cute::_256, cute::_128>, cute::Shape<cute::_1, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized>;

const TileOps* tile_64x256x128_pingpong(ElemType y) { return tile_ops_for<Tile64x256>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
