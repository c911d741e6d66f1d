// cuda.cutlass_sm90, tile 64 x 128 x 128 (tokens x channels x K), ping-pong schedule, 2 x 1
// cluster: the two CTAs of a cluster take neighbouring 64-token blocks of the same 128 channels,
// and each weight tile is loaded once from L2 and multicast to both (128-256 tokens, where the
// 64 x 128 tile without a cluster loads every weight tile once per token block).
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile64x128C2 = TileConfig<
    cute::Shape<cute::_64, cute::_128, cute::_128>, cute::Shape<cute::_2, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized>;

const TileOps* tile_64x128x128_pingpong_c2(ElemType y) { return tile_ops_for<Tile64x128C2>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
