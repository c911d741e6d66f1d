// cuda.cutlass_sm90's 128 x 128 pingpong tile (cluster 2x1), quantizing the activations inside
// the GEMM launch (cutlass_sm90_quantizing_mainloop.cuh).
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile128x128Q = TileConfig<
    cute::Shape<cute::_128, cute::_128, cute::_128>, cute::Shape<cute::_2, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized, true>;

const TileOps* tile_128x128x128_pingpong_q(ElemType y) { return tile_ops_for<Tile128x128Q>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
