// cuda.cutlass_sm90, tile 64 x 64 x 256 (tokens x channels x K), ping-pong schedule, no cluster:
// tile 3 with k-tiles of 256 bytes, half as many loads per stage of twice the size. As the
// quantize kernel's dependent at M = 64 it measured about 0.6 and 1.0 us faster than tile 3 on
// the two longest benchmark layers and 0.7 slower on 4096 x 14336 (H100, the means of three runs;
// docs/kernels.md, "The 64-token tiles with k-tiles of 256 bytes"), so a layer times both at load.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile64x64K256 = TileConfig<
    cute::Shape<cute::_64, cute::_64, cute::_256>, cute::Shape<cute::_1, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized>;

const TileOps* tile_64x64x256_pingpong(ElemType y) { return tile_ops_for<Tile64x64K256>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
