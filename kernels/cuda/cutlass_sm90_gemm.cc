#include "kernels/cuda/cutlass_sm90_gemm.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/dtype.h"
#include "kernels/core/status.h"
#include "kernels/core/tuning_cache.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_host_call.h"
#include "kernels/cuda/cutlass_sm90_device.h"
#include "kernels/cuda/gemm_s8_check.h"
#include "kernels/cuda/l2_flush.h"
#include "kernels/cuda/quantize_s8.h"

namespace qlinear::gpu {

#if QLINEAR_HAVE_CUTLASS
bool cutlass_sm90_compiled_in() { return true; }
#else
bool cutlass_sm90_compiled_in() { return false; }
#endif

namespace {

// --- Tile ladder ---------------------------------------------------------------------------
//
// Which tile configuration serves which M (tokens). An M x N problem has M*N / tile-area tiles
// for 132 SMs: 64-token tiles keep the SMs busy up to a few hundred tokens, 128 x 128 tiles with
// a 2-CTA cluster sharing each weight tile win from there on. Measured on the H200 (GEMM with the
// fused epilogue, no quantization; bare cuBLASLt int8 GEMM of the same shape in brackets; us):
//
//   shape (N x K)    M     64x128 pingpong   128x128 pingpong c2   128x256 coop c2
//   4096 x 4096      256   11.4              16.0                  25.9        (19.2)
//   8192 x 8192      256   31.1              29.7                  46.8        (53.1)
//   57344 x 8192     256   183.6             170.1                 187.2       (182.1)
//   4096 x 4096      1024  31.3              26.5                  27.3        (37.2)
//   4096 x 14336     1024  106.4             79.1                  75.6        (77.5)
//   8192 x 8192      2048  242.8             173.0 (1589 TOPS)     180.9       (175.0)
//   28672 x 4096     4096  1027.2            617.3                 766.7       (594.5)
//   8192 x 8192      8192  1481.0            796.1                 905.1       (778.9)
//
// The 128 x 256 cooperative configuration stays compiled for the benchmark's sweep; it wins
// nowhere by enough to earn a rung.
struct TileStep {
  int64_t m_max;
  CutlassSm90Tile tile;
};
// The tile scheduler's walk stays CUTLASS's choice (CutlassSm90Args::raster 0: along M where tiles
// along N outnumber those along M) without swizzle. No other walk won by more than the
// run-to-run spread (qlinear_gpu_bench --scheduler on the H200, every candidate of one M timed in
// turns; us, warm / after a 256 MB read / the op with the quantize kernel first; rN: 0 CUTLASS's,
// 1 along M, 2 along N; sN: swizzle):
//   8192 x 8192, M = 2048, 128x128:  r0 s1 189.5 / 193.1 / 210.9   r0 s2 190.0 / 193.6 / 210.0
//                                    r1 s1 191.5 / 195.6 / 212.2   r2 s4 193.3 / 196.2 / 212.9
//                                    r0 s8 197.0 / 198.3 / 216.7   (cuBLASLt 195.7 / 203.8)
//   4096 x 4096, M = 4096, 128x128:  r0 s1 91.6 / 94.6 / 111.4     r1 s2-s8 97.7-99.1 warm,
//                                    r2 s1 92.9 / 95.6 / 111.5     ops 116.1-117.8 (cuBLASLt 94.9)
//   28672 x 4096, M = 4096, 128x128: s1 636.5-654.4 / 637.3-661.9 / 650.0-673.9 (r0 and r1, the
//                                    same walk here), s2-s8 639-737 / 676-744 / 690-758
//                                    (cuBLASLt 682.1 / 662.3)
//   8192 x 8192, M = 8192, 128x128:  r0 s1 787 / 811 / 904   r2 s1 792 / 790 / 875
//                                    r0 s8 840 / 806 / 874   r1 s2-s8 969-1026 / 919-1020 /
//                                    961-1127 (cuBLASLt 769 / 773)
// and a swizzle of 8 at M = 1024 (4096 x 4096, 4096 x 14336) made the GEMM 2.5 times slower.
// The 128 x 256 cooperative tile was slower than 128 x 128 in every walk, or within 1 us of it
// (4096 x 4096 and 4096 x 14336 at M = 1024). At this size the GPU runs at its power cap, so which
// candidate ran before weighs more than the walk: cuBLASLt's GEMM took 195.7 us here against
// 175.6-177.9 us in the full benchmark's tile sweep.
constexpr TileStep kLadder[] = {
    {256, CutlassSm90Tile::k64x128x128Pingpong},
    {std::numeric_limits<int64_t>::max(), CutlassSm90Tile::k128x128x128Pingpong},
};

// Exceptions to the ladder by layer width, from the tile sweep of bench/gpu/gpu_bench.cc (GEMM
// with the fused epilogue, us; 64x128 / 64x64 / 64x256; M = 1 and 16 with the rows past M
// zero-filled, as they were before kReadWholeTokenBlocks: read, each tile there runs about as
// fast as at M = 64):
//   shape (N x K)   M=1                M=16               M=64               M=128
//   4096 x 4096     14.6/ 14.6/ 17.5   13.8/ 13.6/ 17.3   12.9/ 10.9/ 17.0   11.1/  9.5/ 15.8
//   6144 x 4096     15.9/ 15.8/ 18.5   15.1/ 15.2/ 17.9   13.2/ 13.1/ 17.4   11.3/ 13.4/ 15.7
//   4096 x 14336    34.1/ 34.8/ 42.7   32.9/ 31.4/ 42.7   28.3/ 22.1/ 41.0   26.3/ 22.5/ 40.7
//   8192 x 8192     29.3/ 29.2/ 32.8   27.4/ 27.5/ 31.6   24.8/ 23.8/ 30.5   25.4/ 26.3/ 30.2
//   28672 x 4096    42.7/ 50.2/ 36.5   38.5/ 46.1/ 36.2   38.7/ 37.5/ 35.9   39.6/ 39.7/ 38.2
//   57344 x 8192   137.2/199.4/118.9  127.6/164.1/115.8  121.1/118.8/117.8  125.4/144.4/130.8
//   8192 x 28672    81.6/ 82.9/ 95.7   76.8/ 79.9/ 91.3   61.9/ 61.8/ 86.5   64.3/ 73.2/ 82.6
// and at M = 256 (64x128 / 128x128 c2): 4096 x 4096 11.4 / 16.4, 4096 x 14336 27.2 / 41.2,
// 8192 x 8192 31.0 / 29.6, 57344 x 8192 181.7 / 168.2, 8192 x 28672 89.9 / 83.8.
// A layer times the tiles on its own weights at load (tune_tiles) and uses these rules only
// where it did not (operands too large to time, or the GPU short of memory at load). From the
// table: 17..64 tokens on layers 16384 or wider, 64 x 256 tiles (each SM streams twice the weight
// rows per K step: 57344 x 8192 at M = 1 runs at 3.95 TB/s); 17..64 tokens elsewhere, and 65..128
// on 4096-wide layers, 64 x 64 tiles (twice the tiles, more SMs streaming); 129..256 tokens on
// layers 8192 or wider, 128 x 128. Halving the tile again does not pay: a 64 x 32 tile (128 CTAs on
// a 4096-wide layer) measured no faster than 64 x 64 anywhere (H200, GEMM alone, us, 64 x 64 / 64 x
// 32: 4096 x 14336 at M = 64 22.6 / 23.0, at M = 1 34.7 / 37.2; 4096 x 4096 at M = 64 11.3 / 11.3;
// 8192 x 8192 at M = 64 23.9 / 24.7), so it was not kept. Up to 16 tokens the swapped 16 x 64 x
// 256 tile beats every 64-token tile on all seven benchmark layers, and is within 0.9 us of the
// fastest swapped tile on each (the table beside kSwapMaxM).
// Two other configurations of the 128 x 128 tile were measured and not kept (H200, bench tile
// sweep, GEMM alone, us, the pingpong tile with its 2 x 1 cluster / the variant):
//   - a 2 x 2 cluster, each activation tile multicast to the two CTAs along N as well, which
//     halves what the activations take out of L2 where every channel block re-reads them. The
//     GPU holds only 30 such clusters at once (cudaOccupancyMaxActiveClusters; 66 of two), so its
//     persistent grid is 120 CTAs: 8192 x 28672 at M = 256 85.1 / 158.8 (128 tiles, two waves),
//     8192 x 8192 at M = 256 30.0 / 47.7, 57344 x 8192 at M = 256 185.5 / 215.7, 28672 x 4096 at
//     M = 256 51.8 / 50.9, 8192 x 8192 at M = 2048 178.0 / 202.7, at M = 8192 813.3 / 937.6 (and
//     the 128 x 256 tile so, 181.9 / 241.0 and 939.5 / 988.6). Per wave of tiles it was no faster
//     (4096 x 4096 at M = 4096: 8 waves of 132 tiles in 86.7, 9 of 120 in 96.1, 10.8 and 10.7 us
//     a wave), so the traffic between L2 and the SMs does not bound these GEMMs;
//   - the cooperative schedule (both consumer warpgroups on one tile), for where a layer has
//     about one tile per SM and the pingpong tile's second warpgroup has none: 8192 x 28672 at
//     M = 256 87.6 / 88.8, 8192 x 8192 at M = 256 30.0 / 29.9, 57344 x 8192 at M = 256 189.9 /
//     208.4, 28672 x 4096 at M = 256 52.4 / 60.4, 8192 x 8192 at M = 2048 181.2 / 221.7; and
//     under a sustained load (bench --energy, the op) 8192 x 8192 at M = 8192 1008.9 / 1045.9.
// What bounds the pingpong tile there is the tensor pipe at the clock the GPU holds (Nsight
// Compute on 8192 x 28672 at M = 256: busy 83% of the cycles at 1.49 GHz; docs/kernels.md).
[[maybe_unused]] CutlassSm90Tile tile_for(int64_t m, int64_t n) {
  if (m <= 16) return CutlassSm90Tile::k16x64x256PingpongSwap;
  if (m <= 64 && n >= 16384) return CutlassSm90Tile::k64x256x128Pingpong;
  if (m > 16 && (m <= 64 || (m <= 128 && n <= 4096))) return CutlassSm90Tile::k64x64x128Pingpong;
  if (m > 128 && m <= 256 && n >= 8192) return CutlassSm90Tile::k128x128x128Pingpong;
  for (const TileStep& s : kLadder) {
    if (m <= s.m_max) return s.tile;
  }
  return kLadder[0].tile;
}

// Up to this M the GEMM is launched as the quantize kernel's programmatic dependent (see
// cutlass_sm90_gemm.h): its launch and set-up then overlap the quantization. Measured on the H200
// (op time, bf16 in/out, us, without -> with): M = 1 on 4096 x 4096 18.4 -> 14.7, M = 16 17.7 ->
// 14.1, M = 64 on 8192 x 8192 29.8 -> 26.8; but from M = 128 the op got slower on every shape
// (M = 256: 4096 x 4096 14.8 -> 16.7, 8192 x 28672 102.2 -> 157.9, 57344 x 8192 199.9 ->
// 308.4), so larger M keep the plain stream order. Triggering at the end of the quantize kernel
// instead of its start measured no better than no PDL at M >= 128 (8192 x 28672, M = 256: 99.4
// us) and lost most of the small-M gain (4096 x 4096, M = 1: 17.1 us).
constexpr int64_t kPdlMaxM = 64;

// Why the programmatic launch slows the tiles without a cluster from M = 128 (bench --diagnose,
// the producers' %globaltimer stamps): it is not a late start (every CTA has started and got past
// the grid dependency 1-7 us after the first), but most CTAs then stream more slowly: 8192 x
// 28672 at M = 128, 64 x 128 tile, time from the dependency's release to the last loads issued,
// fastest / median / slowest CTA, 53.0 / 56.0 / 57.7 us in stream order, 50.9 / 71.9 / 76.0 us
// as the dependent. From M = 128 the quantize kernel's blocks hold every SM, and the GEMM's CTAs
// take the SMs in the order those blocks end, not the launch's own order; the CTAs that read the
// same weight tiles (neighbouring token blocks) no longer run side by side. A tile with a 2 x 1
// cluster keeps them together (co-scheduled, each weight tile multicast to both) and loses
// nothing: the 64 x 128 tile with a cluster, at M = 128, op in stream order / as the dependent
// (us): 6144 x 4096 15.2 / 15.1, 4096 x 4096 15.0 / 14.4, 28672 x 4096 43.6 / 42.4, 4096 x 14336
// 35.0 / 32.8, 8192 x 8192 29.8 / 29.2, 57344 x 8192 136.3 / 135.9, 8192 x 28672 73.9 / 73.3,
// where the 64 x 128 tile without one is, in stream order, 15.3, 15.0, 43.6, 33.2, 30.0, 134.6
// and 73.9. So tiles with a cluster are launched as the dependent up to this M. At M = 256 it
// measured mixed: the 64 x 128 tile with a cluster 57344 x 8192 230.7 -> 239.1 us, 4096 x 14336
// 37.6 -> 37.3; the 128 x 128 tile (2 x 1 cluster) as the dependent ahead of the best tile in
// stream order by 0.3 and 0.9 us on 6144 x 4096 and 8192 x 8192, behind it by 3.7-12.4 us on
// the other five shapes. With the weights' evict-first hint (kWeightsEvictFirst), a tile with a
// cluster whose token blocks all fit in one cluster (each weight tile read once, by one cluster)
// gains from it beyond this M too: the 128 x 128 tile at M = 256, op in stream order / as the
// dependent (bench --weights_hint, in turns, three rounds, us): 6144 x 4096 20.4-20.6 / 20.1,
// 4096 x 4096 20.2-20.3 / 19.5-19.6, 28672 x 4096 58.8-61.1 / 58.4-60.0, 4096 x 14336
// 47.2-47.6 / 46.4-46.8, 8192 x 8192 34.9-35.5 / 34.1-34.8, 57344 x 8192 199.3-210.2 /
// 198.4-208.3, 8192 x 28672 113.3-114.7 / 112.0-113.6; while the 64 x 128 tile with a cluster
// (4 token blocks at M = 256) stayed within 0.3 us or lost (57344 x 8192 238.6-247.8 /
// 241.4-250.7, 8192 x 28672 121.6-126.8 / 122.3-127.8). So such a tile is the dependent up to
// M = cluster x tile rows as well (see served_with_pdl).
constexpr int64_t kPdlClusterMaxM = 128;
// From M = 1024 (the quantize kernel then runs a warp per row on at most two blocks per SM, whose
// blocks all end together) the dependent launch measured 1-2.5 us faster for the 128 x 256 tile
// and mixed for the 128 x 128 tile (bench tile sweep, 8192 x 8192 at M = 2048, four runs). Timing
// both launches per tile at load and keeping the faster measured no better served: 8192 x 8192
// at M = 2048 218.8 us (193.9-227.9 in stream order over four runs), 4096 x 4096 at M = 4096
// 106.6 (105.3-106.8), and twice the candidates let the load's noisy timing pick a slower tile
// at 4096 x 4096, M = 1024 (38.2 us against 33.5-34.8). Large M keep the stream order.

}  // namespace

// A quantizing tile always launches so, inside its own launch. Otherwise: up to kPdlMaxM, and with
// a cluster up to kPdlClusterMaxM or while the token blocks fit in one cluster.
bool cutlass_sm90::served_with_pdl(int64_t m, const TileOps& tile) {
  if (m <= kPdlMaxM) return true;
  if (tile.cluster_ctas <= 1) return false;
  return m <= kPdlClusterMaxM || token_blocks_fit_cluster(m, tile.block_m, tile.cluster_ctas);
}

// Only while the quantize kernel's blocks leave at least half the SMs free. The GEMM's CTAs
// (nearly all of an SM's shared memory and registers) cannot share an SM with a quantize block,
// so those on its SMs start, and stream their first weights, only as it leaves. On 8192 x 28672
// at M = 16 the split takes 8 blocks per row, 128 SMs; measured on the H200 (bench --pad_rows, the
// op as served, in turns, us, split -> whole rows, two runs): 64 x 64 tile 64.2 -> 63.1 and
// 64.9 -> 63.6, 64 x 128 tile 82.3 -> 63.2 and 88.0 -> 64.7. Where the split leaves half the SMs
// free it measured the same or faster than whole rows: 4096 x 14336 at M = 16 (4 blocks per row,
// 64 SMs) 64 x 64 22.2 -> 22.7 and 22.9 -> 23.5; 57344 x 8192 (2 per row) 64 x 256 116.4 ->
// 119.5; 28672 x 4096 64 x 128 34.8 -> 36.6 (one run), 35.2 -> 34.8 (the other).
bool cutlass_sm90::split_quantize_rows(int64_t m, int64_t k, int sm_count) {
  return m * quantize_blocks_per_row(m, k) <= sm_count / 2;
}

namespace {

// With the programmatic launch, the weights each CTA prefetches into L2 before it waits for the
// quantize kernel (cutlass_sm90_dependent_mainloop.cuh): DRAM streams the weights while the
// activations are quantized. Measured on the H200 (bench tile sweep, the quantize kernel then the
// GEMM as its dependent, us, no prefetch / 64 KB / 128 KB / 256 KB per CTA): 8192 x 28672 at
// M = 64, 64 x 128 tile 68.3 / 67.7 / 67.7 / 67.9; 4096 x 14336 at M = 64, 64 x 64 tile
// 26.6 / 26.2 / 26.0 / 26.0; 28672 x 4096 at M = 1, 64 x 256 tile 40.1 / 39.4 / 39.6 / 40.4; at
// M = 1 and 16 on 4096-wide layers within 0.3 us either way. Less than the quantize kernel's
// time: the GEMM's CTAs that share an SM with a quantize block start only when it ends. Having
// the quantize kernel's blocks prefetch the weights' first columns instead (8, 16 or 32 MB, one
// bulk L2 prefetch per weight row) measured slower at every M up to 256, by 2-6 us at M = 16-256
// and up to 5x at M = 1, where one block issues every row's prefetch. Nor did the producer
// prefetching, beside each k-tile's loads, the weights of the k-tile 2, 4 or 8 ahead into L2
// (commit ac0dac1, reverted): no faster on 6144 x 4096 and 4096 x 4096 (within 0.1 us with the
// 16 x 64 x 512 tile, whose 8 k-tiles a tile leave little to prefetch past its first 4 stages)
// and 0.7-13 us slower on the other five layers at M = 1 and 16, the GEMM alone as well (bench
// --swap, the op as served, in turns, three rounds, us, the fastest swapped tile without / with
// 2 / 4 / 8 k-tiles ahead):
//   4096 x 4096, M = 1     11.1-11.2 / 11.1-11.3 / 11.1-11.3 / 11.3-11.5
//   28672 x 4096, M = 1    32.6-32.8 / 36.4-36.6 / 36.9-37.1 / 33.3-33.5
//   8192 x 28672, M = 1    61.0-61.6 / 68.2-68.5 / 68.8-69.3 / 70.0-70.2
//   57344 x 8192, M = 16  113.6-114.5 / 125.1-126.4 / 125.2-126.3 / 125.5-126.5
constexpr int64_t kWeightPrefetchBytes = 64 << 10;

// With the programmatic launch, each CTA also issues its first tile's weights into every pipeline
// stage of shared memory before it waits (the activations' loads of those stages after it): the
// SM itself streams weights during the quantize kernel, not only L2. Measured on the H200 (bench
// tile sweep, the quantize kernel then the GEMM as its dependent with the 64 KB prefetch, at
// M = 64, us, without -> with, two runs): 64 x 128 tile 6144 x 4096 15.9 -> 15.9 / 15.9 -> 15.8,
// 8192 x 8192 27.5 -> 26.7 / 27.4 -> 26.9, 57344 x 8192 122.3 -> 121.3 / 124.3 -> 123.4,
// 8192 x 28672 67.5 -> 67.0 / 68.9 -> 67.6; 64 x 64 tile 4096 x 14336 25.5 -> 25.1 / 26.2 -> 25.4,
// 28672 x 4096 38.6 -> 38.1 / 38.8 -> 38.0; never more than 0.1 us slower on the 21 tile and
// layer pairs. Not for the tiles with a cluster (as the dependent up to M = 128): the 64 x 128
// tile with one measured 0-1.3 us slower with it at M = 128 (8192 x 28672: 73.7 -> 75.0 /
// 74.4 -> 75.1), its CTAs mostly starting only as the quantize kernel's blocks leave the SMs.
constexpr bool kWeightsAhead = true;

// The tiles with their operands swapped issue only this many stages' weights ahead of the wait,
// not every stage the pipeline holds (CutlassSm90Args::weights_ahead_stages): with every stage the
// quantize kernel ended later (bench --diagnose, the producers' stamps: the grid dependency was
// released 3.2 us after the first CTA started on 4096 x 4096 at M = 1 with the 16 x 64 x 256 tile,
// 2.1 us with the 64 x 64 tile, whose stages hold half as many weights; 6.1 against 4.1 us on
// 28672 x 4096), and the op with it. Measured on the H200 (bench --swap, the op as served, in
// turns, three rounds, us, the fastest swapped tile with every stage ahead / 4 stages / 2):
//   layer          M = 1                                M = 16
//   6144 x 4096     13.4-13.6 / 12.7-12.8 / 12.9-13.1     13.6-13.8 / 12.9-13.0 / 13.1-13.4
//   4096 x 4096     11.6-11.8 / 11.1-11.3 / 11.3-11.4     11.5-11.8 / 11.2-11.3 / 11.1-11.4
//   28672 x 4096    33.6-33.8 / 32.7-32.8 / 32.8-32.9     33.9-34.2 / 33.1-33.6 / 33.2-33.3
//   4096 x 14336    21.2-21.4 / 20.9-21.1 / 21.0-21.2     21.7-21.8 / 21.2-21.3 / 21.1-21.3
//   8192 x 8192     23.0-23.2 / 22.2-22.3 / 22.2-22.5     23.1-23.3 / 22.4      / 22.4-22.5
//   57344 x 8192   111.0-113.2 / 110.8-112.9 / 110.8-113.0  112.5-114.1 / 112.2-113.9 / 112.2-114.0
//   8192 x 28672    60.3-60.4 / 59.7-60.1 / 60.2-60.4     61.2-61.5 / 60.3-60.4 / 61.7-61.9
// With 4 stages the 16 x 64 x 512 tile was the fastest on four of the seven layers at M = 1.
// Without the 64 KB L2 prefetch, or with 256 KB of it, 4 stages measured slower on most layers
// (4096 x 4096 at M = 1, 16 x 64 x 512: 11.6-11.8 and 11.6-11.7 against 11.3-11.6). The 64 x 64
// tile keeps every stage: with 4 it gained up to 0.7 us on some layers but lost up to 0.8 on
// others (8192 x 28672 at M = 16: 64.0-64.3 -> 64.8-65.0).
constexpr int kSwapWeightsAheadStages = 4;
int served_ahead_stages(const cutlass_sm90::TileOps& tile) {
  return tile.swaps_operands ? kSwapWeightsAheadStages : 0;
}

// Where the swapped tiles outnumber the SMs (28672 x 4096 and 57344 x 8192 among the benchmark
// layers), some CTAs stream one tile more than the others, the last wave on fewer SMs. The CTAs
// without a last-wave tile prefetch the first k-tiles of those tiles into L2 at their start, this
// many bytes over all of them (CutlassSm90Args::tail_prefetch_bytes; 1-5 k-tiles of each tile).
// Measured on the H200 (bench --tail, the op with 4 stages ahead, in turns, three rounds, us,
// without -> with 4 MB):
//   layer, tile                    M = 1                        M = 16
//   28672 x 4096, 16 x 64 x 256    33.4-33.6 -> 33.1-33.2       33.9-34.0 -> 33.6-33.8
//                 16 x 64 x 512    33.1-33.3 -> 33.0-33.1       33.4-33.5 -> 33.2-33.4
//                 16 x 128 x 256   33.6-33.8 -> 33.2-33.3       33.2-33.4 -> 32.7-32.8
//   57344 x 8192, 16 x 64 x 256    110.8-111.1 -> 110.1-110.2   112.2-112.5 -> 111.8-111.9
//                 16 x 64 x 512    110.5-110.7 -> 109.7-110.0   112.1-112.2 -> 110.8-110.9
//                 16 x 128 x 256   119.0-119.2 -> 118.7-119.1   117.1-117.4 -> 116.8-117.1
// In a later run on another machine 4 MB was again the fastest budget on 28672 x 4096 (16 x 128
// x 256 at M = 16 33.9-34.0 -> 33.1-33.4; 2 MB 33.3-33.8) and within 0.3 us on 57344 x 8192.
// With 8 MB the gain was smaller or none on 28672 x 4096 (16 x 64 x 256 at M = 1: 33.4-33.5),
// and 16 or 32 MB lost, up to 10 us (16 x 64 x 256 on 57344 x 8192 at M = 16: 122.5-122.9 with
// 32 MB). Prefetched instead by the CTAs that own those tiles, each its own, 4 and 8 MB gained up
// to 1.1 us on 57344 x 8192 but were mixed on 28672 x 4096: 0.3-0.7 us faster with the 16 x 128
// x 256 tile at M = 1 in a run on another machine, 0.2-0.4 us slower with 16 x 64 x 512 at M = 16
// in the run above (33.6-33.9 against 33.4-33.5). Where the tiles are fewer than the SMs, filling
// the grid with CTAs that only prefetched the tiles' last k-tiles into L2, 4-32 MB in all (commit
// b1f0ad7, reverted; bench --idle, in turns, three rounds), was faster nowhere at M = 1 or 16: with
// 4 MB 0.1-4.2 us slower where 36-68 CTAs prefetched (6144 x 4096, 4096 x 4096, 4096 x 14336; e.g.
// 4096 x 4096 at M = 1 11.3-11.6 -> 12.6-12.9 us), the same within 0.5 us where 4 did (8192 x
// 8192 and 8192 x 28672 with the 64-channel tiles), up to 30 us slower with 32 MB, and the GEMM
// alone slower too (4096 x 4096 at M = 1 10.3-10.4 -> 12.8-13.0 us with 8 MB).
// Nor, where the tiles outnumber the SMs, did a grid cut to as few CTAs as keep the same number of
// waves, every CTA then streaming as many tiles (28672 x 4096: 112 CTAs of 4 tiles of 64 channels
// instead of 132 of 3 or 4; 57344 x 8192: 128 of 7). Measured on the H200 (bench --tail "bal",
// three runs on different machines, the op, the fastest tile's fastest of three rounds, us, every
// SM with the 4 MB prefetch / the cut grid):
//   layer, M             run 1            run 2            run 3
//   28672 x 4096, 1      32.7 / 32.5      33.0 / 32.4      32.4 / 32.4
//   28672 x 4096, 16     32.8 / 33.3      32.6 / 32.9      32.7 / 33.5
//   57344 x 8192, 1     111.7 / 111.7    108.6 / 109.5    111.5 / 111.6
//   57344 x 8192, 16    110.9 / 114.2    109.4 / 111.2    111.6 / 113.3
// Timed at load as a further form of each swapped tile (commit dd374ba, reverted), the cut grid
// was picked at M = 16 on 28672 x 4096 in a full benchmark run and served 33.6 us there, where the
// same run's --tail measured it 0.8-1.0 us slower than every SM. At most 0.6 us at M = 1 on one
// layer did not pay for a form that the load's timing ranks wrongly.
// Nor did starting each channel tile's k-loop at a different k-tile (tile t at k-tile r t mod the
// k-tiles, wrapping; the mainloop's own loads, those ahead of the wait and the L2 and last-wave
// prefetches alike; commit 55bfdb4, reverted), although weights read alone in that order came
// 1.0-1.3 us faster on 57344 x 8192 (r = 1, 3 or 5; later runs, r = 1: 1.4-1.8 us, bench --reads
// "rot1", docs/kernels.md, "What bounds the swapped tiles"). Measured
// on the H200 (one run, in turns, three rounds, the op, the fastest tile, us). With the 4 MB
// last-wave prefetch (bench --tail; without / r = 1 / r = 3):
//   57344 x 8192  M = 1   110.8-110.9 / 109.9-110.0 / 110.0-110.2
//                 M = 16  109.7-109.8 / 109.3-109.4 / 109.3-109.5
//   28672 x 4096  M = 1    32.9-33.0  /  33.2-33.3  /  33.2
//                 M = 16   32.8-32.9  /  32.7-32.9  /  32.5-32.7
// With 4 stages ahead and no last-wave prefetch (bench --swap, without / r = 1), at M = 1:
// 4096 x 4096 11.8-11.9 / 12.6-12.7, 4096 x 14336 21.8-21.9 / 22.4-22.5, 8192 x 28672 58.6-59.2 /
// 59.8-60.0; within 0.2 us on 6144 x 4096 and 8192 x 8192; and 2.6-11.4 us slower on the 64 x 64
// tile. A gain on one layer of seven did not pay for the rule.
// Nor did prefetching the last wave's last k-tiles into L2 late, once a CTA had issued its own
// last loads (its producer's load_tail; on the claiming tiles the first grid - tail CTAs to get
// there, counted in the workspace, on the static deal the CTAs that own no tile of that wave; the
// bytes shared among that wave's tiles; commit 2b57ff8, reverted), so that the wave's owners
// would read their last k-tiles from L2. Measured on the H200 (bench --claim,
// one run, the op as served with the 4 MB above, in turns, three rounds, us; without / 4 / 8 /
// 16 MB late; t8, t9: the 16 x 64 x 256 and 16 x 64 x 512 tiles, c8, c9: their claiming forms):
//   28672 x 4096, M = 1   t8 34.4-34.5 / 34.6-34.8 / 34.0-34.3, t9 33.8-33.9 / - / 34.0-34.1,
//                         c8 33.3-33.4 / 33.1-33.2 / 33.4 / 34.2, c9 32.9-33.0 / - / 33.1-33.3
//                 M = 16  t8 33.8-33.9 / 33.9-34.2 / 33.9-34.0, t9 33.3-33.5 / - / 33.4-33.5,
//                         c8 33.0-33.5 / 33.4-33.6 / 33.6-33.9 / 34.4-34.6, c9 33.1-33.3 / - /
//                         33.3-33.6
//   57344 x 8192, M = 1   t8 110.5-110.6 / 110.8-110.9 / 111.0-111.1, t9 110.3-110.4 / - /
//                         110.8-111.0, c8 109.0-109.5 / 109.0-109.1 / 109.2 / 109.6-109.9,
//                         c9 109.3-109.4 / - / 109.1
//                 M = 16  t8 110.0-110.1 / 109.8-110.1 / 109.9-110.1, t9 109.0-109.2 / - /
//                         109.3-109.5, c8 110.1-110.2 / 109.9-110.1 / 110.2-110.5 / 111.3-111.4,
//                         c9 109.6-109.8 / - / 109.5-109.8
// At most 0.4 us faster (t8 at M = 1, which the claiming tiles beat by more without it), as often
// slower, and with 16 MB 0.4-1.6 us slower on both layers at both M. The last CTA issued its last
// loads no sooner with it (28672 x 4096 at M = 1, claiming 16 x 64 x 256: 23.6 us after the grid
// dependency without and with 8 MB).
constexpr int64_t kSwapTailPrefetchBytes = int64_t{4} << 20;
int64_t served_tail_prefetch_bytes(const cutlass_sm90::TileOps& tile) {
  return tile.swaps_operands ? kSwapTailPrefetchBytes : 0;
}

// Where each weight tile is read once (its m-blocks within one cluster), the weights' TMA loads
// carry an evict-first L2 hint (cutlass_sm90_dependent_mainloop.cuh): the weights pass through L2
// once, and the stock loads' evict-normal let them push out the activations and the lines still in
// flight. Measured on the H200 (bench --weights_hint, the op as served, in turns, weights rotated
// up to M = 64, us, without -> with): 8192 x 28672 M = 64 64 x 128 tile 67.4 -> 64.8, 64 x 64
// 68.3 -> 65.2, M = 128 64 x 128 with a cluster 73.9 -> 72.2, M = 256 128 x 128 (2 x 1
// cluster) 118.2 -> 115.0; 57344 x 8192 M = 16 64 x 256 125.7 -> 122.1, M = 64 64 x 64 124.5 ->
// 118.0, M = 128 64 x 128 with a cluster 139.4 -> 134.9; 28672 x 4096 M = 64 64 x 128 38.2 ->
// 35.3; 8192 x 8192 M = 64 64 x 64 26.8 -> 24.2, M = 256 128 x 128 36.9 -> 34.7; 4096 x 14336
// M = 64 64 x 64 25.7 -> 23.6. Within 0.3 us on 4096 x 4096 and 6144 x 4096, but for the latter
// at M = 1 (64 x 128 15.9 -> 16.3, 64 x 64 17.8 -> 18.3), where cuda.stream_s8 serves. The same
// three rounds agreed. At large M, where the tiles' token blocks outnumber the cluster, no hint
// paid: the 128 x 128 and 128 x 256 tiles after the quantize kernel, in stream order, us, stock /
// the weights evict-first / the activations evict-last / both (in turns, two rounds): 4096 x
// 4096 at M = 1024 33.3 / 32.3 / 33.5 / 32.4 (128 x 128), at M = 4096 111.0 / 117.0 / 112.5 /
// 118.2; 28672 x 4096 at M = 4096 656.9 / 660.0 / 657.3 / 692.4; 8192 x 8192 at M = 2048
// 208.4 / 210.8 / 209.0 / 210.6, at M = 8192 887.0 / 893.0 / 897.9 / 918.0; 4096 x 14336 at
// M = 1024 within 1.5 us (128 x 256: 100.3 / 101.1 / 100.3 / 100.9).
constexpr bool kWeightsEvictFirst = true;

// The activations' buffer (xq, in the call's scratch) holds the tokens rounded up to 128 rows,
// the largest tile's token block (cutlass_sm90::xq_rows_for), and the GEMM's TMA loads of the
// activations cover them all (CutlassSm90Args::xq_rows): the last token block's rows past M are
// read from the buffer (any values: their products land in accumulator rows the epilogue never
// stores) instead of being zero-filled by the TMA as out of bounds. The zero-filled boxes stalled
// the weights' stream: a 64-token tile ran as fast at M = 64 as at M = 1 only once its rows were
// all inside the tensor. Measured on the H200 (bench --pad_rows, in turns, weights rotated, us,
// zero-filled -> read; the op as served, then the GEMM alone):
//   layer           M    64 x 64 op    64 x 128 op   64 x 64 alone  (64 x 64 alone at M = 64)
//   4096 x 4096     1    14.7 -> 12.0  14.2 -> 13.5  14.7 -> 11.0   11.1
//   4096 x 4096     16   13.5 -> 12.1  13.6 -> 13.5  13.9 -> 11.3
//   6144 x 4096     1    17.6 -> 13.7  16.0 -> 14.6  16.3 -> 13.6   13.2
//   28672 x 4096    1    50.3 -> 35.1  40.8 -> 35.5  48.0 -> 34.9   36.1
//   4096 x 14336    1    35.2 -> 22.4  32.0 -> 27.6  34.8 -> 21.2   21.2
//   4096 x 14336    16   29.7 -> 22.4  27.6 -> 26.3  31.7 -> 21.2
//   8192 x 8192     1    31.7 -> 23.3  29.4 -> 24.1  28.4 -> 23.2   23.0
//   8192 x 8192     16   29.9 -> 24.2  27.0 -> 24.3  27.4 -> 23.1
//   57344 x 8192    1   173.9 -> 116.3 135.5 -> 119.3 174.0 -> 115.8 118.8
//   57344 x 8192    16  144.8 -> 115.5 131.0 -> 118.8 143.4 -> 116.3
//   8192 x 28672    1    83.4 -> 61.9  76.7 -> 62.0  81.3 -> 60.4   61.0
//   8192 x 28672    16   84.3 -> 64.4  96.3 -> 88.8  76.8 -> 60.6
//   8192 x 28672    32   73.9 -> 64.1  70.0 -> 63.8  70.5 -> 60.9
// (the 64 x 256 tile 0-4 us; y identical both ways; at M = 64 all within 0.3 us). With it the
// load picks cuda.cutlass_sm90 at M = 1 on five of the seven benchmark layers, where it had
// picked cuda.stream_s8 on all.
constexpr bool kReadWholeTokenBlocks = true;
// The rows of xq a call of m tokens holds and the GEMM's loads cover.
int64_t served_xq_rows(int64_t m) {
  return kReadWholeTokenBlocks ? cutlass_sm90::xq_rows_for(m) : m;
}

// Up to this M tune_tiles times whole ops (the quantize kernel on made-up bf16 activations, then
// the GEMM launched as served), not the GEMM alone: here the GEMM overlaps the quantize kernel
// (kPdlMaxM, kPdlClusterMaxM), and how much depends on the tile, not only on its GEMM's time. A
// CTA cannot share an SM with a quantize block (one block per row), so a tile with few CTAs
// starts them all at once beside the quantize kernel where a tile with more waits for its
// blocks to end. Measured on the H200 (bench tile sweep, three runs, us, M = 64): 8192 x 28672,
// GEMM alone 64 x 64 tile 62.0-62.5 / 64 x 128 tile 62.1-63.0 (the GEMM alone picks 64 x 64),
// op as served 68.3-68.6 / 66.8-67.8; 57344 x 8192, GEMM alone 64 x 256 118.3-122.7 / 64 x 128
// 121.5-124.7, op as served 121.7-126.3 / 121.2-123.2. Before, only the M between kPdlMaxM and
// kPdlClusterMaxM (where some tiles are launched as the dependent and others are not) were.
// Timing whole ops at M = 256 too (stream order there) picked no faster tiles: the op within
// +-1 us on five layers, 0.7 us slower on 4096 x 14336 (one run).
constexpr int64_t kWholeOpMaxM = kPdlClusterMaxM;

// The token counts at which a layer times every tile at load (tune_tiles, up to the M whose
// operands fit kTuneBytes); which timed choice a call of M tokens takes: tuned_index. The best
// tile at 2048 tokens is not always the best beyond: measured on the H200 (bench --prefill, the
// quantize kernel then the GEMM, in turns, us, three runs), 8192 x 8192 at M = 8192 128 x 256
// (the load's choice at 2048 in a full benchmark run) 925.2 / 969.1 / 962.7, 128 x 128 888.4 /
// 907.5 / 867.2. (Those runs launched every GEMM as the quantize kernel's programmatic
// dependent, which serving does not do at these M; so launched, the 64 x 256 tile lost on
// 28672 x 4096 at M = 4096, 767.0 / 774.3 / 760.1 against 702.0 / 684.5 / 701.5, but in stream
// order, as served, it measured 709.5 against 694.7 for the 128 x 128 tile, and 8192 x 8192 at
// M = 8192 128 x 256 933.8 against 898.8: one run.) Under a sustained load, the GPU at its power
// cap, the ranking can turn: see docs/kernels.md, "The power cap at large M".
constexpr int64_t kTuneMs[] = {1, 16, 64, 128, 256, 1024, 2048, 4096, 8192};
// From this M on, a call whose own M was not timed (its operands over kTuneBytes, or the GPU short
// of memory at load) takes the choice at the largest M timed (tuned_index).
constexpr int64_t kTuneLargestTimedFromM = 2048;

// After every tile's first timing (the median of 5 calls), the fastest kTuneFinalists are timed
// again in kTuneRounds rounds of one call each, in turns, and the fastest median wins: the GPU's
// clock drifts during a load, and a tile timed apart from its rivals could win or lose by it.
// Measured on the H200 (bench, the served op): with one timing per tile a load of 4096 x 4096 at
// M = 1024 picked the 64 x 128 tile (38.2 us) where the others picked 128 x 128 (33.5-34.8 us).
constexpr size_t kTuneFinalists = 3;
constexpr int kTuneRounds = 7;

// A cold timing reads 4x the L2 before each call (CallTimer), which takes the kernels' code and
// the activations out of L2 as well as the weights. A served call finds only its weights gone:
// the other layers' calls stream theirs with the evict-first hint, and its activations have just
// been written. So after each L2 read tune_tiles runs the candidate's call once, untimed, on this
// many channels of zero weights: its code, the activations and the quantize kernel's output back
// in L2, its weights still in DRAM. Without it tile 15, whose warps each wait for their own code
// on the op's critical path, timed up to 3 us slow: on the H200 at M = 1 (full benchmark, the
// finalists' medians at load, us) 4096 x 4096 tile 8 12.8, tile 15 14.1 and 6144 x 4096 tile 8
// 15.1, tile 15 15.5, where the benchmark's cold timing of the same ops after tile 14 (the same
// kernel, its code in the SMs' instruction caches) gave tile 8 12.7 and tile 15 10.4-11.2; its
// CTAs' stamps after an L2 read and tile 8's op put its last epilogue at 10.1 us against 7.2 in
// turns (bench --streamk). With it the load picked tile 15 on 6144 x 4096 in three full runs out
// of three (the op as served 14.1 -> 12.5-12.9 us) and on 4096 x 4096 in two (11.2 -> 10.6 and
// 10.8; the third timed tile 8 0.4 us ahead and served 11.4); docs/kernels.md, "The whole op in
// one launch".
constexpr int64_t kPrimeChannels = 256;
// Then the call once more on kPrimeSmChannels channels per SM of zero weights and one k-tile of K
// (kPrimeK), so that every SM the timed call runs on (up to every SM), not just those of the first
// prime's few tiles, holds the candidate's code in its instruction caches, as in a decode loop
// where the layer's kernel ran a step before. Without it tile 15, timed in turns after another
// finalist, lost what it won where its own calls preceded (H200, the load's own samples, 4096 x
// 4096 at M = 1, us: its first timing 10.6-10.8 and first finalist round 10.5-10.8, the next six
// rounds 12.6-13.9, tile 8's 12.0-14.3 throughout; 28672 x 4096: 34.7, then 34.1, then 36.4-38.0;
// without any prime its later rounds took 14.1-15.2 and 38.9-40.5).
constexpr int64_t kPrimeSmChannels = 256;
constexpr int64_t kPrimeK = 256;

// Up to kRotateMaxM tokens tune_tiles times each candidate as a decode step serves it, where the
// GPU has the memory: back to back with the calls before it, each call on the next of several
// copies of the layer's weights (at least kRotateBytes of them together, over 4x the L2, so that
// each call streams its weights from HBM), in turns of kRotateTurn calls of one candidate timed
// call by call, the first of each turn left out (it follows another candidate's call, or the
// candidate's warm-up). A turn is queued behind a kernel that holds the stream for kRotateHoldNs,
// so that its calls run back to back as a served graph's replays do, not at the rate the host
// launches them. The copies (at most kRotateMaxExtraBytes besides the layer's own, in one buffer)
// live only while the layer times its tiles, once per shape with shared tuning. Elsewhere, or
// without the memory, each call is timed cold after an L2 read and the primes.
constexpr int64_t kRotateMaxM = 64;
constexpr size_t kRotateBytes = size_t{256} << 20;
constexpr size_t kRotateMaxExtraBytes = size_t{512} << 20;
constexpr int kRotateTurn = 6;
constexpr uint64_t kRotateHoldNs = 300'000;

// Whether a tile with a cluster would leave some of its CTAs without a token: m fills fewer token
// blocks than the cluster holds (the 64 x 128 tile with a 2 x 1 cluster up to M = 64, the 128-token
// tiles up to 128). Such a CTA computes rows past M only; tune_tiles does not time those tiles.
// Measured on the H200 (bench --weights_hint, the op as served, in turns, us, the fastest tile
// without a cluster / the 64 x 128 tile with one): M = 1 4096 x 4096 12.7 / 14.1, 28672 x 4096
// 34.1 / 38.0, 4096 x 14336 22.8 / 27.6, 8192 x 8192 22.9 / 25.0, 8192 x 28672 62.4 / 65.6;
// M = 16 8192 x 8192 23.7 / 26.0; slower on all seven benchmark layers at M = 1, 16 and 64. Yet
// a load once timed the clustered tile fastest at M = 1 on 8192 x 8192, and served 28.5 us there
// (full benchmark); the next full run, without it, served the 64 x 64 tile there in 24.3 us.
bool cluster_has_idle_ctas(int64_t m, const cutlass_sm90::TileOps& tile) {
  return cutlass_sm90::token_blocks(m, tile.block_m) < tile.cluster_ctas;
}

// The index in kTuneMs whose choice a call of m tokens takes.
size_t tune_index(int64_t m) {
  size_t i = 0;
  while (i + 1 < std::size(kTuneMs) && m > kTuneMs[i]) ++i;
  return i;
}

// From this M on tune_tiles times whole ops (the quantize kernel on made-up bf16 activations, then
// the GEMM), not the GEMM alone: the quantize pass changes what the GEMM finds in L2, and not by
// the same for every tile. Measured on the H200 (us, GEMM alone / quantize alone / the two in
// sequence): 2048 x 8192 x 8192 128 x 128 tile 180.4 / 17.1 / 222.3, 128 x 256 tile
// 178.7 / 17.1 / 239.1; GEMM-only timing picked the tile that serves the op slower. The
// quantizing tiles (activations quantized inside the GEMM launch) can only be compared this way;
// below this M the first waves of tiles need every row at once anyway.
constexpr int64_t kQuantizingMinM = 512;
// Whether tune_tiles considers them. Not yet. Measured on the H200 (bench tile sweep, us): the
// 128 x 128 quantizing tile's op / the same with every row quantized first / the quantize kernel
// then the plain 128 x 128 tile, in one sequence:
//   4096 x 4096 x 4096      138.8 / 107.6 / 106.0   (the auxiliary warps fall behind)
//   28672 x 4096 x 4096     779.3 / 800.5 / 738.0   (the walk along N costs the weights' reuse)
//   2048 x 8192 x 8192      227.9 / 228.8 / 205.3
//   8192 x 8192 x 8192      898.7 / 947.5 / 925.9   (the one win)
// With the auxiliary warps claiming 4 rows at a time (bench --prefill, in turns, against the
// quantize kernel then the plain 128 x 128 tile): 4096^3 126.6 / 108.1 / 105.5, 28672 x 4096 x
// 4096 764.8 / 763.9 / 702.0, 2048 x 8192 x 8192 231.3 / 233.2 / 210.3, 8192^3 881.7 / 885.4 /
// 888.4; in another run 4096^3 123.7 / 107.5 / 104.7, 8192^3 903.4 / 925.2 / 907.5. Where they
// win it is by under 1%: at 8192^3 the quantization inside the GEMM hides 4-22 us of the quantize
// kernel's 73-77 us. Under a sustained load (bench --energy, the GPU at its power cap) they win
// nothing: 8192^3 979.7-980.2 against 978.6-989.5 us for the quantize kernel then the plain
// 128 x 128 tile; the op costs the two kernels' energy at the cap wherever the quantization runs
// (docs/kernels.md, "The power cap at large M").
// They stay compiled, tested and benchmarked. So does their form that quantizes every row in the
// GEMM's set-up where the tiles fit one wave (prefix 0), which lost at M = 128 and 256 on every
// benchmark layer (bench --setup_quant; docs/kernels.md, "Quantization inside the GEMM").
constexpr bool kTuneQuantizingTiles = false;

// Up to this M tune_tiles times the tiles with their operands swapped (16 tokens per tile, the
// weights' channels on the MMA's M side, see TileConfig::kSwapAB); beyond it they would read every
// weight tile once per 16 tokens. Measured on the H200 (bench --swap, the op as served, in turns,
// three rounds, us, M = 1; the 64 x 64 tile / swapped 16 x 64 x 256 / 16 x 64 x 512 /
// 16 x 128 x 256):
//   6144 x 4096     14.0-14.1    13.2-13.3    13.3         13.4
//   4096 x 4096     12.5         11.5-11.6    11.4-11.5    12.4-12.5
//   28672 x 4096    35.8-35.9    34.1-34.2    33.9-34.1    35.8-36.0
//   4096 x 14336    22.6-22.7    21.1         21.2-21.3    24.5
//   8192 x 8192     23.2-23.6    22.4-22.7    22.5-22.7    22.9
//   57344 x 8192   117.4-117.8  112.0-112.1  112.4        115.6-116.0
//   8192 x 28672    62.7-62.8    60.6-60.7    60.4-60.6    61.0-61.2
// and at M = 16 alike (28672 x 4096: 36.2-36.3, 34.4-34.5, 34.2-34.3, 33.6-33.8); docs/kernels.md
// has the whole table. With k-tiles of 128 bytes they were slower (same runs: 16 x 64 x 128
// 12.6-12.7 on 4096 x 4096, 21.8 on 4096 x 14336, 112.4-112.7 on 57344 x 8192; 16 x 256 x 128
// 34.1-34.4 on 28672 x 4096, 15.7-15.8 on 4096 x 4096), and were dropped.
// A swapped 16 x 128 tile on the cooperative schedule with CUTLASS's stream-K scheduler (every
// SM an even share of the k-tiles, split tiles summed in a workspace whose barriers a memset
// zeroes before each call) was compiled, tested and measured, and lost everywhere (same bench, M =
// 1, us, op / GEMM alone, the swapped 16 x 64 x 128 tile in brackets): 4096 x 4096 18.7 / 14.9
// (12.4 / 10.5), 28672 x 4096 41.6 / 38.5 (35.5 / 34.8), 4096 x 14336 28.9 / 25.0 (22.2 / 20.7),
// 8192 x 8192 30.5 / 26.7 (23.5 / 22.3), 57344 x 8192 120.2 / 117.1 (113.1 / 112.9), 8192 x 28672
// 68.7 / 64.6 (61.3 / 59.8).
// So did a split K of our own on the 16 x 64 x 256 swapped tile (commit 3170a88, reverted): K cut
// into 2 or 4 slices run as the GEMM's batches, each element's int32 partial sums meeting in one
// 64-bit word by an atomic add that also counts the slices (the last to arrive applies the
// epilogue and stores y), the words zeroed by the quantize kernel. y was bit-exact, but twice the
// CTAs on a 4096-wide layer did not stream its weights any faster, and the sums cost more at 16
// tokens (same bench, the first of three rounds, the op / the GEMM alone, us, the unsplit tile /
// 2 slices / 4 slices):
//   4096 x 4096   M = 1   11.4 / 11.8 / 12.5    10.1 / 10.8 / 11.5
//                 M = 16  11.5 / 14.3 / 17.1    10.1 / 12.7 / 15.1
//   28672 x 4096  M = 1   33.3 / 37.0 / 41.1    32.7 / 33.9 / 37.7
//   4096 x 14336  M = 1   21.5 / 21.6 / 21.6    20.4 / 20.7 / 21.0
//   8192 x 28672  M = 1   59.6 / 59.6 / 59.6    58.7 / 59.3 / 59.6
// and slower on the other layers too (57344 x 8192 at M = 16: 110.0 / 137.0 / 156.7).
// Two more swapped tiles measured slower as well (a later run of the same bench, three rounds,
// the op at M = 1, us, 16 x 128 x 256 / 16 x 128 x 512 (fewer, larger stages) / 16 x 256 x 256 (on
// 28672 x 4096 one tile per CTA, 112 CTAs), with the kept tiles' best in brackets):
//   4096 x 4096     12.3-12.4    13.5-13.6    18.4-18.7    (16 x 64 x 256 11.5-11.6)
//   28672 x 4096    35.4-35.5    35.9-36.0    34.9-35.0    (16 x 64 x 512 34.0-34.2)
//   57344 x 8192   117.2-117.4  118.0-118.3  113.3-113.4   (16 x 64 x 256 111.0-111.2)
// and in the first round 4096 x 14336 24.6 / 29.6 / 48.6, 8192 x 28672 61.2 / 65.1 / 100.3.
constexpr int64_t kSwapMaxM = 64;

// The claiming tiles (CutlassSm90Tile::k16x64x256ClaimSwap, k16x64x512ClaimSwap: the swapped
// tiles whose CTAs claim their tiles at run time from a counter,
// cutlass_sm90_claiming_scheduler.cuh) draw their next tile as they start loading the current one
// (CUTLASS's dynamic-persistent way). Drawing it later, once 1, 2 or 4 k-tiles of the current
// tile's loads were left (the producer signalling the scheduler warp through a word in global
// memory), was slower on every layer, also where each CTA has one tile. Measured on the H200
// (qlinear_gpu_bench --claim, the op as served, in turns, three rounds, us, two runs on different
// machines; 16 x 64 x 256 on the static deal / claiming, drawing at the start / drawing 1 and 4
// k-tiles before the end; 16 x 64 x 512 on the static deal / claiming, drawing at the start):
//   28672 x 4096 M=1  34.3 / 33.4-33.5 / 35.7-36.0, 35.2-35.6    33.7-34.0 / (not timed)
//                     33.5-33.7 / 33.4-33.5 / 35.5-35.7, 35.4    33.2 / 32.8-32.9
//               M=16  34.0-34.1 / 33.3-33.4 / 35.8-36.0, 35.0-35.2    33.6-33.7 / (not timed)
//                     33.7-33.8 / 33.2-33.4 / 35.4-35.6, 35.1-35.2    33.1-33.3 / 33.2-33.3
//   57344 x 8192 M=1  111.4-111.6 / 110.8-110.9 / 114.9-115.0, 114.6-114.7    111.3-111.6 / -
//                     110.0 / 111.5-111.8 / 114.8-114.9, 114.7-115.1    109.8-110.0 / 111.0-111.3
//               M=16  112.0-112.2 / 111.8-111.9 / 115.2-115.3, 115.1-115.2    110.4-110.6 / -
//                     111.8-112.1 / 112.0-112.2 / 115.4-115.5, 115.5-115.7   111.2-111.4 /
//                     111.6-111.8
//   8192 x 8192  M=1  22.4-22.6 / 22.5-22.7 / 23.4-23.8, 22.9-23.2    22.0-22.2 / (not timed)
// and within 0.3 us of the static deal at the draw's start on the layers whose tiles do not
// outnumber the SMs (one tile per CTA), but 8192 x 8192 at M = 16 in the first run (23.2-23.6
// against 22.9-23.2) and 6144 x 4096 at M = 16 in the second (13.2-13.5 against 13.8). So claiming
// pays where the tiles past the last whole wave are few (28672 x 4096: 52 of 448 tiles of 64
// channels on 132 SMs; the fastest CTAs take them) and not where they nearly fill a wave (57344 x
// 8192: 104 of 896), and a layer times the claiming tiles at load only where its last, partial wave
// fills at most half the grid (kClaimMaxTailShare): in the second run the load, timing them on
// 57344 x 8192 as well, served the claiming 16 x 64 x 256 tile there at M = 1, 111.7 us, where the
// static tile took 110.0 in the same run's --claim.
constexpr int kClaimLead = 0;
constexpr int kClaimMaxTailShare = 2;  // the last wave's tiles at most 1 / this of the grid

// Whether a layer times a claiming tile at load: its tiles outnumber the grid's CTAs and those past
// the last whole wave fill at most 1 / kClaimMaxTailShare of the grid (see kClaimLead).
bool claiming_pays(int64_t tiles, int ctas) {
  if (ctas <= 0 || tiles <= ctas) return false;
  const int64_t tail = tiles % ctas;
  return tail > 0 && tail * kClaimMaxTailShare <= ctas;
}

// The swapped whole-tile kernel quantizing the activations inside its launch (tile 15): the whole
// op in one kernel, with no grid dependency, where x lies in device memory.
constexpr CutlassSm90Tile kFusedTile = CutlassSm90Tile::k16x64x256WholeSwapQ;

// set_cutlass_sm90_forced_tile's tile, or -1.
std::atomic<int> g_forced_tile{-1};

// How many tile timings in this process made the weight copies (cutlass_sm90_timings_over_copies).
std::atomic<int64_t> g_timings_over_copies{0};

// The tiles a layer times at load: those without a workspace, the claiming tiles, then tile 15
// (timed as the whole op it is, at the M it takes).
constexpr auto kTimedTiles = [] {
  std::array<CutlassSm90Tile, kCutlassSm90Tiles + std::size(kClaimingTiles) + 1> t{};
  for (int i = 0; i < kCutlassSm90Tiles; ++i) t[i] = static_cast<CutlassSm90Tile>(i);
  for (size_t i = 0; i < std::size(kClaimingTiles); ++i)
    t[kCutlassSm90Tiles + i] = kClaimingTiles[i];
  t.back() = kFusedTile;
  return t;
}();

// The plain tile with the same GEMM as a quantizing one (for calls it cannot take: fp32
// activations, long rows, unaligned x).
CutlassSm90Tile plain_twin(CutlassSm90Tile t) {
  switch (t) {
    case CutlassSm90Tile::k128x128x128PingpongQ:
      return CutlassSm90Tile::k128x128x128Pingpong;
    case CutlassSm90Tile::k64x256x128PingpongQ:
      return CutlassSm90Tile::k64x256x128Pingpong;
    default:
      return t;
  }
}

constexpr DType kYTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
[[maybe_unused]] int y_index(DType t) { return t == DType::kF32 ? 0 : t == DType::kF16 ? 1 : 2; }

// Where run_device keeps its intermediates inside the caller's scratch (each 256-byte aligned).
struct ScratchLayout {
  size_t xq = 0, sa = 0, azp = 0, counters = 0, workspace = 0, workspace_bytes = 0, total = 0;
  // (ws_bytes: the tile's workspace, a claiming tile's counter and signals.)
  ScratchLayout(int64_t m, int64_t k, size_t ws_bytes) : workspace_bytes(ws_bytes) {
    size_t off = 0;
    auto take = [&off](size_t bytes) {
      const size_t at = off;
      off += align_up(bytes);
      return at;
    };
    xq = take(static_cast<size_t>(served_xq_rows(m) * k));
    sa = take(static_cast<size_t>(m) * 4);
    azp = take(static_cast<size_t>(m) * 4);
    counters = take(static_cast<size_t>(quantizing_tile_counters(m)) * 4);
    workspace = take(ws_bytes);
    total = off;
  }
};

class CutlassSm90Prepared final : public HostCallPreparedKernel {
 public:
  // With context.tuning, the tiles come from an earlier layer of the same shape where one timed
  // them, and this layer's timed tiles are stored there otherwise (not on demand: see
  // PrepareContext; on demand the tiles are timed cold, without the weight copies).
  static absl::StatusOr<std::unique_ptr<CutlassSm90Prepared>> create(const LayerWeights& weights,
                                                                     const PrepareContext& context);

  size_t device_scratch_bytes(int64_t m) const override {
    return ScratchLayout(m, weights_.config.k, claim_workspace_bytes(sm_count_)).total;
  }
  int64_t extra_bytes() const override {
    return HostCallPreparedKernel::extra_bytes() +
           static_cast<int64_t>(adj_.size() + bias_v_.size());
  }

 private:
  explicit CutlassSm90Prepared(const LayerWeights& weights) : HostCallPreparedKernel(weights) {
    tuned_.fill(-1);
    tuned_unfused_.fill(-1);
  }
  absl::Status init(const PrepareContext& context);
  // Times the tiles (into tuned_, tuned_unfused_ and tuned_times_); over copies of the weights
  // up to kRotateMaxM where `copies_wanted` and the GPU has the memory, else cold. *every_m:
  // whether it timed every M it would on a GPU with memory to spare, with the primes.
  absl::Status tune_tiles(bool copies_wanted, bool* every_m);
  CutlassSm90Tile tile_for_call(int64_t m) const;
  int forced_tile(int64_t m) const;
  // The tile a call of m tokens runs where tile_for_call's is tile 15 but the call cannot take
  // it (x in host memory, outputs mirrored there, a debug call, x not 16-bit): the fastest other
  // tile timed.
  CutlassSm90Tile unfused_tile_for_call(int64_t m) const;
  // The index in kTuneMs whose timed choice a call of m tokens takes (tuned_ there may be -1).
  size_t tuned_index(int64_t m) const;
  std::string variant(int64_t m) const override;
#if QLINEAR_HAVE_CUTLASS
  // A call's arguments that come from the layer (weights, scales, column sums, bias_v for y,
  // scheme) for m tokens; the activations' and outputs' buffers are the caller's.
  CutlassSm90Args layer_args(int64_t m, DType y) const;
#endif
  absl::Status enqueue(const DeviceRunArgs& args, void* scratch, cudaStream_t stream,
                       const StageEvents* events, const DeviceDebugOutputs* debug) const override;
  // Only the quantize kernel reads x, unless the call's tile quantizes inside the GEMM. (Not so
  // for tile 15: a small call's x then stays in pinned host memory, which every CTA of tile 15
  // would read across PCIe, and the call runs unfused_tile_for_call's tile after the quantize
  // kernel instead.)
  bool x_read_once(const RunArgs& args) const override {
    const CutlassSm90Tile t = tile_for_call(args.m);
    return !tile_quantizes(t) || t == kFusedTile;
  }
  // The fused epilogue writes y once; the quantize kernel mirrors sa and azp (a quantizing
  // tile's mainloop writes them itself, and does not).
  bool outputs_direct(const RunArgs& args) const override { return x_read_once(args); }

  int sm_count_ = 0;
  DeviceBuffer adj_;
  DeviceBuffer bias_v_;  // [3][N]: bias_v for y in fp32, fp16, bf16 (kYTypes order)
  // The tile timed fastest on this layer at each of kTuneMs; -1 where not timed (tile_for).
  std::array<int, std::size(kTuneMs)> tuned_;
  // The same without tile 15 (unfused_tile_for_call).
  std::array<int, std::size(kTuneMs)> tuned_unfused_;
  // The finalists' median times at each of kTuneMs, fastest first ("tile 8 13.8, tile 15 14.2"),
  // for the explanation; empty where not timed in turns.
  std::array<std::string, std::size(kTuneMs)> tuned_times_;
  // Whether the three came from an earlier layer of this shape (TuningCache).
  bool tuned_shared_ = false;
  // When they were timed: "at load", or "on first use" (PrepareContext::on_demand).
  const char* timed_when_ = "at load";
  // What a TuningCache holds for a shape.
  struct TunedTiles {
    std::array<int, std::size(kTuneMs)> tile, unfused;
    std::array<std::string, std::size(kTuneMs)> times;
  };
};

absl::StatusOr<std::unique_ptr<CutlassSm90Prepared>> CutlassSm90Prepared::create(
    const LayerWeights& weights, const PrepareContext& context) {
  std::unique_ptr<CutlassSm90Prepared> p(new CutlassSm90Prepared(weights));
  RETURN_IF_ERROR(p->init(context));
  // init already touched every tile's kernel when it raised its shared-memory limit; the rest of
  // the path loads here.
  RETURN_IF_ERROR(p->warm_up());
  return p;
}

absl::Status CutlassSm90Prepared::init(const PrepareContext& context) {
#if QLINEAR_HAVE_CUTLASS
  TuningCache* const tuning = context.tuning;
  const LayerConfig& c = weights_.config;
  RETURN_IF_ERROR(attach());
  int device = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  RETURN_IF_CUDA_ERROR(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  for (const CutlassSm90Tile t : kTimedTiles) {
    for (DType y : kYTypes) {
      const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(t, static_cast<ElemType>(y));
      if (ops == nullptr)
        return absl::InternalError("cuda.cutlass_sm90: no tile for an output type");
      RETURN_IF_CUDA_ERROR(ops->prepare());
    }
  }

  const size_t n = static_cast<size_t>(c.n);

  // Column sums for the schemes with zero points (see the header: the quantizer's azp selects
  // what they do); a symmetric layer's epilogue has no zero-point term (layer_args).
  if (is_asymmetric(c.scheme)) {
    std::vector<int32_t> colsum(n, 0);
    for (size_t r = 0; r < n; ++r) {
      const int8_t* row = weights_.w.data() + r * static_cast<size_t>(c.k);
      int32_t s = 0;
      for (int64_t i = 0; i < c.k; ++i) s += row[i];
      colsum[r] = s;
    }
    RETURN_IF_ERROR(adj_.allocate(n * 4, "the weights' column sums"));
    RETURN_IF_CUDA_ERROR(cudaMemcpy(adj_.get(), colsum.data(), n * 4, cudaMemcpyHostToDevice));
  }

  // bias_v per output type: bias_f (the bias rounded to the output type and widened back), or
  // the zero that makes the fma the SPEC's expression for a layer without bias.
  std::vector<float> bias_v(3 * n);
  const float no_bias = is_asymmetric(c.scheme) ? 0.f : -0.f;
  for (int t = 0; t < 3; ++t) {
    for (size_t i = 0; i < n; ++i) {
      bias_v[t * n + i] = c.has_bias ? round_to_dtype(weights_.bias[i], kYTypes[t]) : no_bias;
    }
  }
  RETURN_IF_ERROR(bias_v_.allocate(3 * n * 4, "the bias per output type"));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpy(bias_v_.get(), bias_v.data(), bias_v_.size(), cudaMemcpyHostToDevice));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  // The tiles an earlier layer of this shape timed, where one did.
  const std::string key =
      tuning != nullptr ? tuning_key("cuda.cutlass_sm90 tiles", this->device(), c) : "";
  if (tuning != nullptr) {
    if (const std::optional<TunedTiles> t = tuning->find<TunedTiles>(key)) {
      tuned_ = t->tile;
      tuned_unfused_ = t->unfused;
      tuned_times_ = t->times;
      tuned_shared_ = true;
      return absl::OkStatus();
    }
  }
  // A GPU too short of memory to time the tiles at all gets the rules, not a failed layer. On
  // demand, beside running requests, the tiles are timed cold: without the rotated timing's
  // weight copies (up to 512 MB more; the cold timing's own buffers stay), and nothing is stored
  // for later layers.
  if (context.on_demand) timed_when_ = "on first use";
  bool every_m = false;
  const absl::Status tuned = tune_tiles(/*copies_wanted=*/!context.on_demand, &every_m);
  if (absl::IsResourceExhausted(tuned)) {
    tuned_.fill(-1);
    for (std::string& t : tuned_times_) t.clear();
    return absl::OkStatus();
  }
  // (What a GPU short of memory timed is not stored: the next layer may have the memory.)
  if (tuned.ok() && every_m && tuning != nullptr && !context.on_demand) {
    tuning->insert(key, TunedTiles{tuned_, tuned_unfused_, tuned_times_});
  }
  return tuned;
#else
  return absl::FailedPreconditionError("cuda.cutlass_sm90 is not compiled in");
#endif
}

// The smallest M of kTuneMs >= m; from kTuneLargestTimedFromM on, the largest M timed instead
// when m's is not.
size_t CutlassSm90Prepared::tuned_index(int64_t m) const {
  size_t i = tune_index(m);
  while (tuned_[i] < 0 && i > 0 && kTuneMs[i - 1] >= kTuneLargestTimedFromM) --i;
  return i;
}

// The forced tile (set_cutlass_sm90_forced_tile) where a call of m tokens can take it: one of the
// tiles a layer times, which takes the layer's shape at m (tile 15: enqueue falls back where the
// call's x cannot be read by it); else -1.
int CutlassSm90Prepared::forced_tile(int64_t m) const {
  const int forced = g_forced_tile.load(std::memory_order_relaxed);
#if QLINEAR_HAVE_CUTLASS
  if (forced < 0) return -1;
  const auto t = static_cast<CutlassSm90Tile>(forced);
  if (std::find(std::begin(kTimedTiles), std::end(kTimedTiles), t) == std::end(kTimedTiles)) {
    return -1;
  }
  if (t == kFusedTile) return forced;
  const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(t, ElemType::kBF16);
  if (ops == nullptr || (ops->swaps_operands && m > kSwapMaxM) ||
      !ops->can_implement(layer_args(m, DType::kBF16))) {
    return -1;
  }
  return forced;
#else
  (void)m;
  (void)forced;
  return -1;
#endif
}

CutlassSm90Tile CutlassSm90Prepared::tile_for_call(int64_t m) const {
  if (const int forced = forced_tile(m); forced >= 0) return static_cast<CutlassSm90Tile>(forced);
  const size_t i = tuned_index(m);
  return tuned_[i] >= 0 ? static_cast<CutlassSm90Tile>(tuned_[i]) : tile_for(m, weights_.config.n);
}

CutlassSm90Tile CutlassSm90Prepared::unfused_tile_for_call(int64_t m) const {
  const size_t i = tuned_index(m);
  return tuned_unfused_[i] >= 0 ? static_cast<CutlassSm90Tile>(tuned_unfused_[i])
                                : tile_for(m, weights_.config.n);
}

std::string CutlassSm90Prepared::variant(int64_t m) const {
#if QLINEAR_HAVE_CUTLASS
  const size_t i = tuned_index(m);
  const CutlassSm90Tile tile = tile_for_call(m);
  const cutlass_sm90::TileOps& ops = *cutlass_sm90::tile_ops(tile, ElemType::kBF16);
  const std::string timed =
      forced_tile(m) >= 0 ? std::string(" (forced: set_cutlass_sm90_forced_tile)")
      : tuned_[i] >= 0    ? absl::StrCat(" (timed fastest ", timed_when_, ", M=", kTuneMs[i],
                                      tuned_shared_ ? kTunedByEarlierLayer : "", ")")
                          : absl::StrCat(" (by rule: not timed ", timed_when_,
                                         ", its operands over 256 MB or the GPU short of memory)");
  constexpr const char* kDependent =
      "; GEMM launched as the quantize kernel's programmatic dependent";
  // The finalists timed in turns (medians), where there were several.
  const std::string times =
      tuned_[i] >= 0 && !tuned_times_[i].empty()
          ? absl::StrCat("; ", timed_when_, ", M=", kTuneMs[i], " (us): ", tuned_times_[i])
          : std::string();
  if (tile == kFusedTile) {
    const cutlass_sm90::TileOps& other =
        *cutlass_sm90::tile_ops(unfused_tile_for_call(m), ElemType::kBF16);
    return absl::StrCat("tile ", ops.name(), timed, "; a call whose x is in host memory runs tile ",
                        other.name(), cutlass_sm90::served_with_pdl(m, other) ? kDependent : "",
                        times);
  }
  return absl::StrCat("tile ", ops.name(), timed,
                      cutlass_sm90::served_with_pdl(m, ops) ? kDependent : "", times);
#else
  (void)m;
  return "";
#endif
}

#if QLINEAR_HAVE_CUTLASS
CutlassSm90Args CutlassSm90Prepared::layer_args(int64_t m, DType y) const {
  const LayerConfig& c = weights_.config;
  CutlassSm90Args g;
  g.w = dev_->w.as<int8_t>();
  g.m = m;
  g.n = c.n;
  g.k = c.k;
  g.sb = dev_->sb.as<float>();
  // Null for the symmetric schemes, whose layers hold no column sums (init): their epilogue has
  // no zero-point term (CutlassSm90Args::adj).
  g.adj = adj_.as<int32_t>();
  g.bias_v = bias_v_.as<float>() + static_cast<size_t>(y_index(y)) * c.n;
  g.y_type = static_cast<ElemType>(y);
  g.sm_count = sm_count_;
  g.weight_prefetch_bytes = kWeightPrefetchBytes;  // used where the GEMM is launched as dependent
  g.weights_ahead = kWeightsAhead;
  g.weights_evict_first = kWeightsEvictFirst;
  g.xq_rows = served_xq_rows(m);
  g.claim_lead = kClaimLead;
  g.qp = quantize_params(c);
  return g;
}
#endif

// Times every tile's fused GEMM (bf16 out, the quantized input made up) on this layer's weights
// at each of kTuneMs, weights coming from HBM for the small M as in serving, and keeps the
// fastest per M. From kQuantizingMinM on it times whole ops on made-up bf16 activations instead
// (see kQuantizingMinM). Sizes whose operands would take over kTuneBytes are left to tile_for.
absl::Status CutlassSm90Prepared::tune_tiles(bool copies_wanted, bool* every_m) {
  *every_m = false;
#if QLINEAR_HAVE_CUTLASS
  tuned_.fill(-1);
  tuned_unfused_.fill(-1);
  for (std::string& t : tuned_times_) t.clear();
  const LayerConfig& c = weights_.config;
  constexpr int64_t kTuneBytes = int64_t{256} << 20;
  int64_t max_m = 0;
  for (int64_t m : kTuneMs) {
    if (m * c.k * 2 <= kTuneBytes && m * c.n * 2 <= kTuneBytes) max_m = m;
  }
  if (max_m == 0) return absl::OkStatus();
  const int64_t wanted_m = max_m;
  // Declared before the timer, so freed after its stream has been synchronised.
  DeviceBuffer x, xq, sa, azp, counters, y, claim, prime_w;
  DeviceBuffer copies;  // the rotated timing's weight copies (kRotateMaxM), one after another
  ASSIGN_OR_RETURN(std::unique_ptr<CallTimer> timer, CallTimer::create());
  // (M = 128 and 256 are timed cold, and M <= 64 where the weight copies do not fit: reserved
  // first, so that the copies give way when memory is short.)
  RETURN_IF_ERROR(timer->reserve_cold());
  // The M timed as whole ops: from kQuantizingMinM (see there), and wherever a tile's GEMM is
  // served as the quantize kernel's programmatic dependent (see kWholeOpMaxM).
  auto whole_op_m = [](int64_t m) { return m >= kQuantizingMinM || m <= kWholeOpMaxM; };
  auto allocate = [&](int64_t top) -> absl::Status {
    RETURN_IF_ERROR(
        xq.allocate(static_cast<size_t>(served_xq_rows(top) * c.k), "tile tuning activations"));
    RETURN_IF_ERROR(sa.allocate(static_cast<size_t>(top) * 4, "tile tuning scales"));
    RETURN_IF_ERROR(azp.allocate(static_cast<size_t>(top) * 4, "tile tuning zero points"));
    RETURN_IF_ERROR(y.allocate(static_cast<size_t>(top * c.n) * 2, "tile tuning outputs"));
    RETURN_IF_ERROR(claim.allocate(claim_workspace_bytes(sm_count_), "tile tuning claim counter"));
    bool whole_ops_from_x = false;
    for (int64_t m : kTuneMs) whole_ops_from_x |= m <= top && whole_op_m(m);
    if (whole_ops_from_x) {
      RETURN_IF_ERROR(x.allocate(static_cast<size_t>(top * c.k) * 2, "tile tuning inputs"));
      RETURN_IF_ERROR(counters.allocate(static_cast<size_t>(quantizing_tile_counters(top)) * 4,
                                        "tile tuning counters"));
    }
    return absl::OkStatus();
  };
  // A GPU short of memory times fewer M (down to none: then the rules, see tile_for_call) rather
  // than failing the layer; the buffers are freed before the load returns.
  for (absl::Status st = allocate(max_m); !st.ok(); st = allocate(max_m)) {
    if (!absl::IsResourceExhausted(st)) return st;
    for (DeviceBuffer* b : {&x, &xq, &sa, &azp, &counters, &y, &claim}) b->reset();
    int64_t lower = 0;
    for (int64_t m : kTuneMs) lower = m < max_m ? m : lower;
    max_m = lower;
    if (max_m == 0) return absl::OkStatus();
  }
  // The primes' weights (zeros; see kPrimeChannels), where the GPU has the memory.
  const int64_t prime_n = std::min<int64_t>(c.n, kPrimeChannels);
  const int64_t prime_sm_n = std::min<int64_t>(c.n, kPrimeSmChannels * sm_count_);
  const int64_t prime_sm_k = std::min<int64_t>(c.k, kPrimeK);
  if (const absl::Status st =
          prime_w.allocate(static_cast<size_t>(std::max(prime_n * c.k, prime_sm_n * prime_sm_k)),
                           "tile tuning prime weights");
      !st.ok() && !absl::IsResourceExhausted(st)) {
    return st;
  }
  if (prime_w.get() != nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMemset(prime_w.get(), 0, prime_w.size()));
  }
  // The weight copies of the rotated timing (kRotateMaxM), where the GPU has the memory.
  const size_t w_bytes = align_up(static_cast<size_t>(c.n * c.k));
  const size_t rotation = std::max<size_t>((kRotateBytes + w_bytes - 1) / w_bytes, 2);
  const bool copies_fit = (rotation - 1) * w_bytes <= kRotateMaxExtraBytes;
  std::vector<const int8_t*> rotated = {dev_->w.as<int8_t>()};
  if (copies_wanted && copies_fit) {
    const absl::Status st = copies.allocate((rotation - 1) * w_bytes, "tile tuning weight copies");
    if (!st.ok() && !absl::IsResourceExhausted(st)) return st;
    if (st.ok()) g_timings_over_copies.fetch_add(1, std::memory_order_relaxed);
    for (size_t i = 0; st.ok() && i + 1 < rotation; ++i) {
      int8_t* copy = copies.as<int8_t>() + i * w_bytes;
      RETURN_IF_CUDA_ERROR(cudaMemcpy(copy, dev_->w.get(), static_cast<size_t>(c.n * c.k),
                                      cudaMemcpyDeviceToDevice));
      rotated.push_back(copy);
    }
  }
  std::vector<cudaEvent_t> turn_events(kRotateTurn + 1, nullptr);
  struct EventsGone {
    std::vector<cudaEvent_t>* e;
    ~EventsGone() {
      for (cudaEvent_t x : *e) {
        // (A failure must not stay in the last-error slot: see DeviceBuffer::reset.)
        if (x != nullptr && cudaEventDestroy(x) != cudaSuccess) cudaGetLastError();
      }
    }
  } events_gone{&turn_events};
  for (cudaEvent_t& e : turn_events) RETURN_IF_CUDA_ERROR(cudaEventCreate(&e));
  size_t next_copy = 0;  // the rotation goes on from turn to turn
  if (x.get() != nullptr) {
    RETURN_IF_ERROR(fill_made_up_activations(x.get(), DType::kBF16,
                                             static_cast<size_t>(max_m * c.k), cudaStreamLegacy));
  }
  {
    // Made-up activations, not zeros (zeros make the tensor cores faster than real data).
    std::vector<uint64_t> fill(xq.size() / 8 + 1);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (uint64_t& v : fill) v = (s = s * 6364136223846793005ull + 1442695040888963407ull);
    RETURN_IF_CUDA_ERROR(cudaMemcpy(xq.get(), fill.data(), xq.size(), cudaMemcpyHostToDevice));
    const std::vector<float> scales(static_cast<size_t>(max_m), 1e-3f);
    RETURN_IF_CUDA_ERROR(cudaMemcpy(sa.get(), scales.data(), sa.size(), cudaMemcpyHostToDevice));
    RETURN_IF_CUDA_ERROR(cudaMemset(azp.get(), 0, azp.size()));
    // The claiming tiles' workspace: zeros, which each of their calls leaves zeroed.
    RETURN_IF_CUDA_ERROR(cudaMemset(claim.get(), 0, claim.size()));
    // The timer's stream does not wait for the legacy stream these ran on.
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  }
  for (size_t i = 0; i < std::size(kTuneMs) && kTuneMs[i] <= max_m; ++i) {
    CutlassSm90Args g = layer_args(kTuneMs[i], DType::kBF16);
    g.xq = xq.as<int8_t>();
    g.sa = sa.as<float>();
    g.azp = azp.as<int32_t>();
    g.y = y.get();
    const bool whole_ops = whole_op_m(g.m);
    if (whole_ops) {
      g.x = x.get();
      g.x_type = ElemType::kBF16;
      g.counters = counters.as<int32_t>();
    }
    // Each tile's call as enqueue runs it at this M.
    struct Candidate {
      int tile;
      CutlassSm90Args args;
      const cutlass_sm90::TileOps* ops;
      double us;
    };
    std::vector<Candidate> candidates;
    const bool cold = g.m <= 256;  // cold L2 where the weights stream, as a served layer finds it
    const bool rotate = g.m <= kRotateMaxM && rotated.size() > 1;
    auto call_of = [&](const Candidate& candidate) {
      return [&, cp = &candidate](cudaStream_t stream) -> absl::Status {
        if (whole_ops && !tile_quantizes(static_cast<CutlassSm90Tile>(cp->tile))) {
          // The quantize kernel, then the GEMM.
          RETURN_IF_CUDA_ERROR(launch_quantize_s8(
              g.x, g.x_type, g.m, g.k, g.qp, xq.as<int8_t>(), sa.as<float>(), azp.as<int32_t>(),
              stream, nullptr, 0, nullptr, cutlass_sm90::split_quantize_rows(g.m, g.k, sm_count_)));
        }
        RETURN_IF_CUDA_ERROR(cp->ops->launch(
            cp->args, tile_claims(static_cast<CutlassSm90Tile>(cp->tile)) ? claim.get() : nullptr,
            stream));
        return absl::OkStatus();
      };
    };
    // After a cold timing's L2 read, the candidate's call on kPrimeChannels channels of zero
    // weights (untimed): its code and the activations back in L2, as a served call finds them;
    // then on kPrimeSmChannels per SM of one k-tile: its code in every SM.
    auto prime_of = [&](const Candidate& candidate) {
      return [&, cp = &candidate](cudaStream_t stream) -> absl::Status {
        if (prime_w.get() == nullptr) return absl::OkStatus();
        Candidate primer = *cp;
        primer.args.n = prime_n;
        primer.args.w = prime_w.as<int8_t>();
        RETURN_IF_ERROR(call_of(primer)(stream));
        // (The quantize kernel before a GEMM quantizes all of K again; the GEMM steps through xq,
        // and tile 15 through x, kPrimeK values a row: a prefix of each buffer, its y unused.)
        primer.args.n = prime_sm_n;
        primer.args.k = prime_sm_k;
        // (Best effort: a tile that would decline the short K is timed with the first prime only.)
        if (!call_of(primer)(stream).ok()) cudaGetLastError();
        return absl::OkStatus();
      };
    };
    // A turn of kRotateTurn calls of `candidate` back to back on the rotated weights (see
    // kRotateMaxM), each timed; the median of all but the first.
    auto rotated_us = [&](const Candidate& candidate) -> absl::StatusOr<double> {
      cudaStream_t s = timer->stream();
      RETURN_IF_CUDA_ERROR(launch_stream_hold(kRotateHoldNs, s));
      RETURN_IF_CUDA_ERROR(cudaEventRecord(turn_events[0], s));
      for (int i = 0; i < kRotateTurn; ++i) {
        Candidate on = candidate;
        on.args.w = rotated[next_copy++ % rotated.size()];
        RETURN_IF_ERROR(call_of(on)(s));
        RETURN_IF_CUDA_ERROR(cudaEventRecord(turn_events[i + 1], s));
      }
      RETURN_IF_CUDA_ERROR(cudaEventSynchronize(turn_events[kRotateTurn]));
      std::vector<double> us;
      for (int i = 1; i < kRotateTurn; ++i) {
        float ms = 0.f;
        RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, turn_events[i], turn_events[i + 1]));
        us.push_back(1000.0 * ms);
      }
      return median_of(us);
    };
    for (const CutlassSm90Tile t : kTimedTiles) {
      // (The quantizing tile 15 is timed wherever its whole op is, see kTimedTiles.)
      if (tile_quantizes(t) && !((kTuneQuantizingTiles || t == kFusedTile) && whole_ops)) continue;
      const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(t, ElemType::kBF16);
      if (ops->swaps_operands && g.m > kSwapMaxM) continue;
      if (!ops->can_implement(g)) continue;
      if (tile_claims(t) && !claiming_pays(cutlass_sm90::tile_count(g.m, g.n, *ops), sm_count_)) {
        continue;
      }
      // (Only the claiming tiles take a workspace: `claim`.)
      if (ops->workspace_bytes(g) > (tile_claims(t) ? claim.size() : 0)) continue;
      if (cluster_has_idle_ctas(g.m, *ops)) continue;
      Candidate cand{static_cast<int>(t), g, ops, 0};
      // As enqueue launches it (the GEMM alone has no kernel before it to depend on).
      cand.args.pdl = whole_ops && cutlass_sm90::served_with_pdl(g.m, *ops);
      cand.args.weights_ahead_stages = served_ahead_stages(*ops);
      cand.args.tail_prefetch_bytes = served_tail_prefetch_bytes(*ops);
      const auto call = call_of(cand);
      // Warm-up (where the timing rotates, on the rotation's next copy).
      Candidate warm = cand;
      if (rotate) warm.args.w = rotated[next_copy++ % rotated.size()];
      RETURN_IF_ERROR(call_of(warm)(timer->stream()));
      if (rotate) {
        ASSIGN_OR_RETURN(cand.us, rotated_us(cand));
      } else {
        ASSIGN_OR_RETURN(cand.us, timer->median_us(5, cold, call, prime_of(cand)));
      }
      candidates.push_back(cand);
    }
    if (candidates.empty()) continue;
    // The fastest few timed again in turns, one call each per round (kTuneRounds), and the
    // fastest median of those kept (see kTuneFinalists).
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.us < b.us; });
    int unfused = -1;  // the fastest other than tile 15 in this first timing
    for (const Candidate& cand : candidates) {
      if (cand.tile != static_cast<int>(kFusedTile)) {
        unfused = cand.tile;
        break;
      }
    }
    if (candidates.size() > kTuneFinalists) candidates.resize(kTuneFinalists);
    std::vector<std::vector<double>> rounds(candidates.size());
    for (int r = 0; r < kTuneRounds && candidates.size() > 1; ++r) {
      for (size_t j = 0; j < candidates.size(); ++j) {
        ASSIGN_OR_RETURN(const double us, rotate ? rotated_us(candidates[j])
                                                 : timer->median_us(1, cold, call_of(candidates[j]),
                                                                    prime_of(candidates[j])));
        rounds[j].push_back(us);
      }
    }
    for (size_t j = 0; j < candidates.size(); ++j) {
      if (rounds[j].empty()) rounds[j].push_back(candidates[j].us);  // (a lone candidate)
    }
    // The finalists by median, fastest first (the earlier on a tie): the choice, the choice
    // without tile 15 (else the first timing's), and the explanation's times.
    std::vector<std::pair<double, size_t>> by_median;
    for (size_t j = 0; j < candidates.size(); ++j) by_median.emplace_back(median_of(rounds[j]), j);
    std::sort(by_median.begin(), by_median.end());
    tuned_[i] = candidates[by_median.front().second].tile;
    tuned_unfused_[i] = unfused;
    for (const auto& [us, j] : by_median) {
      if (candidates[j].tile != static_cast<int>(kFusedTile)) {
        tuned_unfused_[i] = candidates[j].tile;
        break;
      }
    }
    for (size_t r = 0; r < by_median.size() && by_median.size() > 1; ++r) {
      absl::StrAppend(&tuned_times_[i], r == 0 ? "" : ", ", "tile ",
                      candidates[by_median[r].second].tile, " ",
                      std::round(by_median[r].first * 10) / 10);
    }
  }
  // (Timings without the primes, on a GPU short of memory, are not what a layer with the memory
  // would time either.)
  // (Nor timings cold for want of the weight copies, where the copies would have fit the budget,
  // nor those that did not want them.)
  *every_m = max_m == wanted_m && prime_w.get() != nullptr && copies_wanted &&
             (rotated.size() > 1 || !copies_fit);
  return absl::OkStatus();
#else
  return absl::OkStatus();
#endif
}

absl::Status CutlassSm90Prepared::enqueue(const DeviceRunArgs& args, void* scratch,
                                          cudaStream_t stream, const StageEvents* events,
                                          const DeviceDebugOutputs* debug) const {
#if QLINEAR_HAVE_CUTLASS
  const LayerConfig& c = weights_.config;
  const int64_t m = args.m;
  if (m < 1 || m > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("M must be in 1..2^31-1");
  }
  const ScratchLayout L(m, c.k, claim_workspace_bytes(sm_count_));
  int8_t* xq = at<int8_t>(scratch, L.xq);
  float* sa = args.sa != nullptr ? args.sa : at<float>(scratch, L.sa);
  int32_t* azp = args.azp != nullptr ? args.azp : at<int32_t>(scratch, L.azp);

  CutlassSm90Args g = layer_args(m, args.y_dtype);
  g.xq = xq;
  g.sa = sa;
  g.azp = azp;
  g.y = args.y;
  CutlassSm90Tile tile = tile_for_call(m);
  if (tile_quantizes(tile)) {
    g.x = args.x;
    g.x_type = static_cast<ElemType>(args.x_dtype);
    g.counters = at<int32_t>(scratch, L.counters);
    const cutlass_sm90::TileOps* q = cutlass_sm90::tile_ops(tile, g.y_type);
    if (tile == kFusedTile) {
      // Tile 15 reads x from every CTA and writes sa and azp only where the GEMM reads them; a
      // debug call's xq comes from the quantize kernel.
      if (q == nullptr || !q->can_implement(g) || args.x_in_host_memory ||
          args.sa_host != nullptr || debug != nullptr) {
        tile = unfused_tile_for_call(m);
      }
    } else if (q == nullptr || !q->can_implement(g) || args.x_in_host_memory) {
      // (Its CTAs would read x across the host link, from pinned memory.)
      tile = plain_twin(tile);
    }
  }
  const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(tile, g.y_type);
  if (ops == nullptr) return absl::InvalidArgumentError("unknown output type");
  g.pdl = cutlass_sm90::served_with_pdl(m, *ops);
  g.weights_ahead_stages = served_ahead_stages(*ops);
  g.tail_prefetch_bytes = served_tail_prefetch_bytes(*ops);

  RETURN_IF_CUDA_ERROR(record_stage(events, 0, stream));
  if (!tile_quantizes(tile)) {
    // A claiming tile's workspace zeroed by the quantize kernel (the scratch is shared with other
    // layers' calls); the GEMM, its programmatic dependent, draws tiles only after it.
    const bool claims = tile_claims(tile);
    RETURN_IF_CUDA_ERROR(
        launch_quantize_s8(args.x, static_cast<ElemType>(args.x_dtype), m, c.k, g.qp, xq, sa, azp,
                           stream, claims ? at<int32_t>(scratch, L.workspace) : nullptr,
                           claims ? static_cast<int64_t>(L.workspace_bytes / 4) : 0, nullptr,
                           cutlass_sm90::split_quantize_rows(m, c.k, sm_count_),
                           RowParamsMirror{args.sa_host, args.azp_host}));
  }
  // A quantizing tile's whole op counts as GEMM time (its quantization runs inside the GEMM).
  RETURN_IF_CUDA_ERROR(record_stage(events, 1, stream));
  RETURN_IF_CUDA_ERROR(ops->launch(g, at<void>(scratch, L.workspace), stream));
  RETURN_IF_CUDA_ERROR(record_stage(events, 2, stream));

  if (debug != nullptr) {
    // The fused epilogue never writes acc: a debug call gets it from an exact GEMM on the same
    // xq (the fused kernel's accumulators show through y, exactly so in fp32 for |acc| < 2^24).
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(debug->xq, xq, static_cast<size_t>(m * c.k),
                                         cudaMemcpyDeviceToDevice, stream));
    RETURN_IF_CUDA_ERROR(
        launch_gemm_s8s8_s32_check(xq, dev_->w.as<int8_t>(), m, c.n, c.k, debug->acc, stream));
  }
  return absl::OkStatus();
#else
  (void)args;
  (void)scratch;
  (void)stream;
  (void)events;
  (void)debug;
  return absl::FailedPreconditionError("cuda.cutlass_sm90 is not compiled in");
#endif
}

class CutlassSm90Kernel final : public Kernel {
 public:
  absl::string_view name() const override { return kCutlassSm90KernelName; }
  absl::Status is_supported(const HostInfo& host) const override {
    if (!cutlass_sm90_compiled_in()) {
      return absl::FailedPreconditionError(
          "not compiled in (the build found no CUTLASS 3.x headers or did not target sm_90a)");
    }
    RETURN_IF_ERROR(cuda_device_usable(host));
    return cutlass_sm90_device_gate(host.gpus[0]);
  }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    RETURN_IF_ERROR(
        check_rows_of_16_bytes(config, "TMA needs 16-byte rows", "TMA needs 16-byte rows"));
    if (shape.m < 1 || shape.m > std::numeric_limits<int32_t>::max()) {
      return absl::FailedPreconditionError(absl::StrCat("M=", shape.m, " is outside 1..2^31-1"));
    }
    return absl::OkStatus();
  }
  // Every M bucket. The full op (cuda.quantize + this GEMM) against cuda.cublaslt's (quantize +
  // cuBLASLt + epilogue kernel), us, H200, bf16 in/out with bias, weights rotated past L2 for
  // M <= 64 (bench/gpu/gpu_bench.cc, one run):
  //
  //   N x K           M=1           M=16          M=64          M=256         M=1024+
  //   6144 x 4096     20.2 / 19.5   19.9 / 18.6   17.7 / 19.6   20.3 / 28.0
  //   4096 x 4096     18.4 / 19.3   17.7 / 17.0   17.2 / 17.1   15.0 / 27.5   107.4 / 141.9 (4096)
  //   28672 x 4096    43.2 / 41.7   43.6 / 43.4   40.0 / 52.3   56.0 / 97.9   707.1 / 892.5 (4096)
  //   4096 x 14336    39.5 / 40.4   37.1 / 31.0   34.3 / 30.7   35.1 / 47.3   95.2 / 104.1 (1024)
  //   8192 x 8192     33.3 / 30.8   32.1 / 33.4   29.8 / 41.1   37.8 / 65.9   196.0 / 224.2 (2048)
  //   57344 x 8192    143.5 / 169.0 134.9 / 172.8 128.0 / 149.0 190.5 / 223.0
  //   8192 x 28672    85.9 / 76.3   81.8 / 79.4   70.4 / 77.7   102.1 / 109.6
  //
  // Up to M = 16 the two are within about 15% either way (sums over the seven shapes: 384 vs
  // 397 us at M = 1, 367 vs 396 us at M = 16); from M = 64 on this kernel is ahead nearly
  // everywhere, up to 1.9x, the epilogue pass that cuBLASLt needs being the difference.
  MRange preferred_m() const override { return MRange{}; }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
    return prepare_with_tuning(weights, PrepareContext{});
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare_with_tuning(
      const LayerWeights& weights, const PrepareContext& context) const override {
    ASSIGN_OR_RETURN(std::unique_ptr<CutlassSm90Prepared> p,
                     CutlassSm90Prepared::create(weights, context));
    return std::unique_ptr<PreparedKernel>(std::move(p));
  }
};

}  // namespace

absl::Status cutlass_sm90_device_gate(const GpuInfo& g) {
  if (g.cc_major != 9 || g.cc_minor != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "needs compute capability 9.0 (sm_90a wgmma), device is sm_", g.cc_major, g.cc_minor));
  }
  return absl::OkStatus();
}

std::unique_ptr<Kernel> make_cutlass_sm90_kernel() { return std::make_unique<CutlassSm90Kernel>(); }

void set_cutlass_sm90_forced_tile(int tile) {
  g_forced_tile.store(tile, std::memory_order_relaxed);
}

int64_t cutlass_sm90_timings_over_copies() {
  return g_timings_over_copies.load(std::memory_order_relaxed);
}

}  // namespace qlinear::gpu
