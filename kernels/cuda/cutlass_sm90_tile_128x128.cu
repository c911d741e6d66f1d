// cuda.cutlass_sm90, tile 128 x 128 x 128 (tokens x channels x K), ping-pong schedule, cluster
// 2 x 1 (two CTAs along M share each weight tile through TMA multicast): the configuration for a
// few hundred to a thousand tokens.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile128x128 = TileConfig<
    cute::Shape<cute::_128, cute::_128, cute::_128>, cute::Shape<cute::_2, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized>;

const TileOps* tile_128x128x128_pingpong(ElemType y) { return tile_ops_for<Tile128x128>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
