// cuda.cutlass_sm90, tile 128 x 256 x 128 (tokens x channels x K), cooperative schedule (both
// consumer warpgroups on one tile), cluster 2 x 1: the prefill configuration, the largest tile
// whose mainloop still keeps several stages in shared memory.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile128x256 = TileConfig<cute::Shape<cute::_128, cute::_256, cute::_128>,
                               cute::Shape<cute::_2, cute::_1, cute::_1>,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                               cutlass::epilogue::TmaWarpSpecializedCooperative>;

const TileOps* tile_128x256x128_coop(ElemType y) { return tile_ops_for<Tile128x256>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
