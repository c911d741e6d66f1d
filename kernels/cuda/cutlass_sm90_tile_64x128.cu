// cuda.cutlass_sm90, tile 64 x 128 x 128 (tokens x channels x K), ping-pong schedule, no cluster:
// the medium-M configuration (one consumer warpgroup per 64-token tile, the other overlapping
// its epilogue with the next tile's mainloop).
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile64x128 = TileConfig<
    cute::Shape<cute::_64, cute::_128, cute::_128>, cute::Shape<cute::_1, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized>;

const TileOps* tile_64x128x128_pingpong(ElemType y) { return tile_ops_for<Tile64x128>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
