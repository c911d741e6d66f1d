// cuda.cutlass_sm90, tile 16 x 64 x 512 (tokens x channels x K), ping-pong schedule, no cluster,
// operands swapped, its CTAs claiming their tiles at run time from a counter
// (cutlass_sm90_claiming_scheduler.cuh): the 16 x 64 x 512 swapped tile otherwise.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile16x64x512Claim =
    TileConfig<cute::Shape<cute::_64, cute::_16, cute::_512>,
               cute::Shape<cute::_1, cute::_1, cute::_1>,
               cutlass::gemm::KernelTmaWarpSpecializedPingpong,
               cutlass::epilogue::TmaWarpSpecialized, /*kQuantize=*/false, /*kSwapAB=*/true,
               /*kClaim=*/true>;

const TileOps* tile_16x64x512_claim_swap(ElemType y) { return tile_ops_for<Tile16x64x512Claim>(y); }

}  // namespace qlinear::gpu::cutlass_sm90
