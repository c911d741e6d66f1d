// cuda.cutlass_sm90's 64 x 256 pingpong tile, quantizing the activations inside the GEMM launch
// (cutlass_sm90_quantizing_mainloop.cuh).
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile64x256Q = TileConfig<
    cute::Shape<cute::_64, cute::_256, cute::_128>, cute::Shape<cute::_1, cute::_1, cute::_1>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized, true>;

const TileOps* tile_64x256x128_pingpong_q(ElemType y) { return tile_ops_for<Tile64x256Q>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
