// cuda.cutlass_sm90, tiles 64 x 64 x 256 (ping-pong, no cluster) and 64 x 128 x 256 (ping-pong,
// 2 x 1 cluster): tiles 3 and 7 with k-tiles of 256 bytes. Bench only.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile64x64K256 = TileConfig<
    cute::Shape<cute::_64, cute::_64, cute::_256>, cute::Shape<cute::_1, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized>;
using Tile64x128K256C2 = TileConfig<
    cute::Shape<cute::_64, cute::_128, cute::_256>, cute::Shape<cute::_2, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized>;

const TileOps* tile_64x64x256_pingpong(ElemType y) { return tile_ops_for<Tile64x64K256>(y); }
const TileOps* tile_64x128x256_pingpong_c2(ElemType y) {
  return tile_ops_for<Tile64x128K256C2>(y);
}

}  // namespace qlinear::gpu::cutlass_sm90
