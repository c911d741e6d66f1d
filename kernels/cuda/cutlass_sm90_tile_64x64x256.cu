// cuda.cutlass_sm90, tile 64 x 64 x 256 (tokens x channels x K), ping-pong schedule, no cluster:
// tile 3 with k-tiles of 256 bytes, half as many loads per stage of twice the size. As the
// quantize kernel's dependent at M = 64 it measured 0.6-1.1 us faster than tile 3 on the longest
// layers and up to 0.7 slower on others (docs/kernels.md, "Tile configurations measured and not
// kept" has the table), so a layer times both at load.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile64x64K256 = TileConfig<
    cute::Shape<cute::_64, cute::_64, cute::_256>, cute::Shape<cute::_1, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized>;

const TileOps* tile_64x64x256_pingpong(ElemType y) { return tile_ops_for<Tile64x64K256>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
