// cuda.cutlass_sm90, tile 128 x 256 x 128 (tokens x channels x K), cooperative schedule, cluster
// 2 x 1, on CUTLASS's stream-K tile scheduler: for calls with fewer such tiles than SMs, every
// SM takes a share of the (tile, k-tile) work (or a slice of each tile's K), the shared tiles'
// int32 partial sums meeting in the workspace. See CutlassSm90Tile::k128x256x128CoopStreamK.
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::cutlass_sm90 {

using Tile128x256StreamK = TileConfig<cute::Shape<cute::_128, cute::_256, cute::_128>,
                                      cute::Shape<cute::_2, cute::_1, cute::_1>,
                                      cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                      cutlass::epilogue::TmaWarpSpecializedCooperative,
                                      /*kQuantize=*/false, /*kSwapAB=*/false, /*kClaim=*/false,
                                      /*kStreamK=*/true>;

const TileOps* tile_128x256x128_coop_streamk(ElemType y) {
  return tile_ops_for<Tile128x256StreamK>(y);
}

}  // namespace qlinear::gpu::cutlass_sm90
