// The device half of cuda.cutlass_sm90 (see cutlass_sm90_gemm.h): a CUTLASS 3.x Hopper TMA
// warp-specialized int8 GEMM whose epilogue applies SPEC section 4 on the accumulators.
//
// Compiled by nvcc and by the host compiler: plain C++ only (see quantize_s8.h). Defined only
// when the CUTLASS headers were found at configure time (QLINEAR_HAVE_CUTLASS).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/quantize_s8.h"

namespace qlinear::gpu {

// The tile configurations compiled in; which one serves which M is the ladder in
// cutlass_sm90_gemm.cc.
enum class CutlassSm90Tile : int {
  k64x128x128Pingpong = 0,   // 64 tokens x 128 channels, one warpgroup per tile
  k128x128x128Pingpong = 1,  // 128 x 128, two consumer warpgroups taking turns
  k128x256x128Coop = 2,      // 128 x 256, two warpgroups on one tile, cluster 2x1
  k64x64x128Pingpong = 3,    // 64 x 64, one warpgroup per tile: few tokens on narrow layers
  k64x256x128Pingpong = 4,   // 64 x 256, one warpgroup per tile: few tokens on wide layers
  // The same two pingpong tiles quantizing the activations inside the GEMM launch
  // (cutlass_sm90_quantizing_mainloop.cuh): their launch takes x, not xq.
  k128x128x128PingpongQ = 5,
  k64x256x128PingpongQ = 6,
  // 64 x 128 with a 2 x 1 cluster: the two CTAs of a cluster take neighbouring token blocks of
  // the same channels and share each weight tile by multicast (128-256 tokens).
  k64x128x128PingpongC2 = 7,
  // Up to 16 tokens with the operands swapped (the weights' channels on the MMA's M side, see
  // TileConfig::kSwapAB): 64 channels with k-tiles of 256 or 512 bytes, 128 with 256.
  k16x64x256PingpongSwap = 8,
  k16x64x512PingpongSwap = 9,
  k16x128x256PingpongSwap = 10,
  // 16 x 64 x 256 with the operands swapped on a stream-K schedule (a kernel of our own: every CTA
  // an equal share of the (tile, k-tile) pairs, shared tiles summed in a workspace). Not among the
  // kCutlassSm90Tiles that a layer times and serves: it measured slower as served (the table is in
  // cutlass_sm90_tile_16x64x256_streamk.cu), and it needs a workspace of zeros.
  k16x64x256StreamKSwap = 11,
  // The 16 x 64 x 256 and 16 x 64 x 512 swapped tiles whose CTAs claim their tiles at run time
  // from a counter (cutlass_sm90_claiming_scheduler.cuh; CutlassSm90Args::claim_lead). A layer
  // times and serves them after the kCutlassSm90Tiles (kClaimingTiles); they need a workspace of
  // claim_workspace_bytes zeros, which each call leaves zeroed (a null workspace runs them on the
  // static deal).
  k16x64x256ClaimSwap = 12,
  k16x64x512ClaimSwap = 13,
  // The stream-K tile's kernel dealing whole tiles instead (CTA c of the grid takes tiles
  // [c * tiles / grid, (c + 1) * tiles / grid), two consumer warpgroups taking its k-tiles in
  // turn): no tile shared, no workspace. Its set-up is its barriers only (no tile scheduler, no
  // register reallocation), its producer issues the first weights at once, its epilogue runs from
  // registers. Not among the tiles a layer times: as the quantize kernel's dependent it is slower
  // than the CUTLASS swapped tiles on most benchmark layers (docs/kernels.md, "A kernel of our own
  // dealing whole tiles").
  k16x64x256WholeSwap = 14,
  // Tile 14 quantizing the activations inside its launch (one kernel for the whole op, no grid
  // dependency): each CTA's producer warp copies the call's rows of 16-bit x into shared memory,
  // takes their statistics, and quantizes each k-tile's activations into its ring slot; CTA 0
  // writes sa and azp. Up to m * K = 10240 (cutlass_sm90_tile_16x64x256_streamk.cu,
  // can_implement_q). A layer times it at load at the M it takes; it is served to calls whose x is
  // in device memory (not to a small served call whose x the quantize kernel reads from pinned host
  // memory once, see cutlass_sm90_gemm.cc).
  k16x64x256WholeSwapQ = 15,
};
// The tiles 0 .. kCutlassSm90Tiles - 1 need no workspace.
inline constexpr int kCutlassSm90Tiles = 11;
inline constexpr CutlassSm90Tile kClaimingTiles[] = {CutlassSm90Tile::k16x64x256ClaimSwap,
                                                     CutlassSm90Tile::k16x64x512ClaimSwap};
inline constexpr bool tile_claims(CutlassSm90Tile t) {
  return t == CutlassSm90Tile::k16x64x256ClaimSwap || t == CutlassSm90Tile::k16x64x512ClaimSwap;
}
// A claiming tile's workspace on a grid of `ctas` CTAs: the counter, then from kClaimSignalsOffset
// one word per CTA (cutlass_sm90_claiming_scheduler.cuh).
inline constexpr size_t kClaimSignalsOffset = 16;
inline constexpr size_t claim_workspace_bytes(int ctas) {
  return (kClaimSignalsOffset + 4 * static_cast<size_t>(ctas < 0 ? 0 : ctas) + 255) / 256 * 256;
}

inline constexpr bool tile_quantizes(CutlassSm90Tile t) {
  return t == CutlassSm90Tile::k128x128x128PingpongQ ||
         t == CutlassSm90Tile::k64x256x128PingpongQ || t == CutlassSm90Tile::k16x64x256WholeSwapQ;
}

// Bytes of shared memory for the quantizing tiles' ring of activation rows: the longest row they
// take (k * 2 bytes of 16-bit activations).
inline constexpr int kAuxRingBytes = 32768;

// The values one CTA writes with CutlassSm90Args::trace: %globaltimer (ns) when its producer
// first entered the mainloop, when it got past the grid dependency, when it had issued its last
// tile's loads; then its SM id in the low 32 bits and the number of tiles it ran in the high 32;
// when a consumer warpgroup first entered the mainloop's multiplies, when the last of its tiles'
// multiplies were done (before that tile's epilogue), and when the CTA started (its first warp's
// prefetch of the TMA descriptors, before the pipelines' set-up); then the SM's clock (cycles,
// %clock64) at that start, when its first thread reached the mainloop's set-up (load_init, after
// the pipelines' barriers are made), when its producer first entered the mainloop, and when a
// consumer warpgroup first entered the multiplies.
inline constexpr int kCutlassTracePoints = 11;

// The values one CTA of the stream-K swapped tile (tile 11, and tile 14) writes with
// CutlassSm90Args::trace, at trace[cta * kStreamKTracePoints]: %globaltimer (ns) at its start, when
// its producer got past the grid dependency, when the producer had issued its last loads, when its
// first k-tile had arrived, when its last k-tile's multiplies were done, and when its epilogue was
// done (the consumer's first thread); then its SM id in the low 32 bits and its k-tiles in the high
// 32, and the number of tiles it shares with other CTAs.
inline constexpr int kStreamKTracePoints = 8;

// What the quantizing tiles' auxiliary warps need (device pointers; filled by the launch from
// CutlassSm90Args). Rows [0, prefix) are quantized by the quantize kernel launched first; rows
// [prefix, m) by the GEMM. counters[0] hands out rows, counters[1 + b] counts the rows of m-block
// b published.
// With unit_rows > 0 (prefix 0, every tile in the grid's first wave) the GEMM quantizes every row
// before its first tile instead, in units of unit_rows rows: CTA c, with all its threads, quantizes
// unit c (c < owned_units) in the mainloop's set-up (the rows' loads issued before the grid
// dependency), claiming it first by its bit in the flags at counters[quantizing_tile_flags_offset];
// counters[0] then hands out units to the auxiliary warps, which take any unit left unclaimed after
// kPrologueStealAfterNs (cutlass_sm90_quantizing_mainloop.cuh). scratch_offset is where the ring
// lies in the kernel's shared memory (the set-up's scratch).
struct QuantizeInGemm {
  const void* x = nullptr;
  ElemType x_type = ElemType::kBF16;
  QuantizeParams qp;
  int8_t* xq = nullptr;
  float* sa = nullptr;
  int32_t* azp = nullptr;
  int32_t* counters = nullptr;
  int m = 0;
  int k = 0;
  int prefix = 0;
  int unit_rows = 0;
  int owned_units = 0;
  int scratch_offset = 0;
};

// Where a quantizing tile's unit flags start among its counters for m tokens: after the row
// counter and one counter per m-block of 64 rows at least.
inline constexpr int64_t quantizing_tile_flags_offset(int64_t m) { return 1 + (m + 63) / 64; }
// int32 counters a quantizing tile needs for m tokens: those, then a bit per unit of the set-up's
// quantization (at most one unit per row).
inline constexpr int64_t quantizing_tile_counters(int64_t m) {
  return quantizing_tile_flags_offset(m) + (m + 31) / 32;
}

// One fused GEMM: y[m, n] = out(fma(sa[m], sb[n] * f32(acc[m, n] - azp[m] * adj[n]), bias_v[n]))
// with acc = xq [m, k] (row-major) x w [n, k]^T, int32 arithmetic wrapping. With azp = the
// quantizer's output (0 for symmetric schemes, the zero point for static asymmetric) and
// adj = the weights' column sums, this is every row of SPEC section 4 in its exact order;
// bias_v is bias_f, or +0 (asymmetric) / -0 (symmetric, where fma(a, b, -0) = a * b exactly) when
// the layer has none. adj null (the symmetric schemes, whose azp is 0) makes the zero-point term
// 0 without a load: the epilogue then reads neither azp nor adj. Device pointers; k % 16 == 0,
// n % 16 == 0.
struct CutlassSm90Args {
  const int8_t* xq = nullptr;
  const int8_t* w = nullptr;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  const float* sa = nullptr;
  const int32_t* azp = nullptr;
  const float* sb = nullptr;
  const int32_t* adj = nullptr;
  const float* bias_v = nullptr;
  void* y = nullptr;
  ElemType y_type = ElemType::kBF16;
  int sm_count = 0;
  // Launch as the programmatic dependent of the stream's previous kernel (which must trigger
  // griddepcontrol.launch_dependents, as the quantize kernel does): the GEMM's set-up overlaps
  // that kernel, and its producer waits for that kernel's results before the first load.
  bool pdl = false;
  // With pdl, the bytes of weights each CTA prefetches into L2 before it waits for that kernel
  // (cutlass_sm90_dependent_mainloop.cuh; tiles without a cluster); 0: none.
  int64_t weight_prefetch_bytes = 0;
  // With pdl, each CTA also issues its first tile's weights into every pipeline stage before it
  // waits, the activations' loads following the wait (cutlass_sm90_dependent_mainloop.cuh; tiles
  // without a cluster, not the quantizing tiles).
  bool weights_ahead = false;
  // With weights_ahead, at most this many stages (0: every stage the pipeline holds; the swapped
  // tiles are served with 4, see kSwapWeightsAheadStages in cutlass_sm90_gemm.cc).
  int weights_ahead_stages = 0;
  // Where a call's tiles outnumber the persistent grid's CTAs (some CTAs then take one tile more
  // than the others, in a last, partial wave) and its tokens fit one token block, the CTAs that
  // own no tile of that wave prefetch the first k-tiles of its tiles' weights into L2 at their
  // start (before the grid dependency wait when launched as a dependent), up to this many bytes
  // over all of them (0: none; tiles without a cluster; cutlass_sm90_dependent_mainloop.cuh; the
  // swapped tiles are served with kSwapTailPrefetchBytes, cutlass_sm90_gemm.cc).
  int64_t tail_prefetch_bytes = 0;
  // Where each weight tile is read once (the tile's m-blocks fit in one cluster: one CTA, or a
  // cluster sharing it by multicast), the weights' TMA loads carry an evict-first L2 hint
  // (cutlass_sm90_dependent_mainloop.cuh); not the quantizing tiles.
  bool weights_evict_first = false;
  // Rows of activations readable at xq (>= m; 0: m). The activations' TMA loads then cover
  // that many rows: a tile's token block whose rows past m lie inside the buffer loads them
  // as any other rows (their products land in accumulator rows the epilogue never stores)
  // instead of the TMA filling them with zeros.
  int64_t xq_rows = 0;
  // The tile scheduler: how many tiles along the minor direction it walks before moving on
  // (1, 2, 4 or 8; L2 reuse at large M), and the direction (0: CUTLASS's choice, 1: along M,
  // 2: along N). The quantizing tiles always walk along N.
  int swizzle = 1;
  int raster = 0;
  // The claiming tiles (k16x64x256ClaimSwap, k16x64x512ClaimSwap): a CTA draws its next tile once
  // this many k-tiles of the current tile's loads are left to issue (0: as soon as it starts
  // loading the current tile, CUTLASS's way, as served; the table is beside kClaimLead in
  // cutlass_sm90_gemm.cc).
  int claim_lead = 0;
  // Tiles 14 and 15 (whole tiles): deal the channels in halves of 32 where that gives the busiest
  // CTA fewer of them (as served); false deals whole tiles of 64 only (the benchmark's --streamk
  // compares both).
  bool half_tiles = true;
  // Diagnostics (the benchmark's --diagnose): when set, each CTA's producer writes
  // kCutlassTracePoints values at trace[cta * kCutlassTracePoints] (see cutlass_sm90_dependent_
  // mainloop.cuh; tiles 11 and 14 kStreamKTracePoints); size it for sm_count CTAs (the
  // persistent grid is never larger).
  uint64_t* trace = nullptr;
  // Quantizing tiles only: the activations x [m, k] (bf16 or fp16, 16-byte aligned, k * 2 <=
  // kAuxRingBytes unless prefix is 0) and the layer's scheme, with xq, sa and azp above as the
  // outputs; counters [quantizing_tile_counters(m)] (no initial value needed); the rows quantized
  // before the GEMM starts (< 0: the tile's own choice, enough for its first two waves of tiles; 0:
  // none, every row quantized in the GEMM's set-up, which the tile declines unless its tiles fit
  // one wave and a unit's rows fit its threads: see QuantizeInGemm).
  const void* x = nullptr;
  ElemType x_type = ElemType::kBF16;
  QuantizeParams qp;
  int32_t* counters = nullptr;
  int64_t prefix = -1;
  // Tests: with the set-up's quantization, how many units the CTAs quantize as their own (< 0:
  // one each); the others are left to the auxiliary warps' fallback.
  int64_t prologue_owned_units = -1;
};

namespace cutlass_sm90 {

// What one tile configuration offers for one output type. Each configuration is compiled in its
// own translation unit (cutlass_sm90_tile_*.cu) so that the slow CUTLASS compilations run in
// parallel.
struct TileOps {
  // Raises the kernel's shared memory limit (once); cudaSuccess or the error.
  cudaError_t (*prepare)();
  // Bytes of workspace for this problem (256-byte aligned pointer); 0 for the data-parallel
  // persistent scheduler of the CUTLASS tiles. The stream-K tile and the claiming tiles need one of
  // zeros, which each call leaves zeroed.
  size_t (*workspace_bytes)(const CutlassSm90Args&);
  // Whether CUTLASS accepts the problem (alignment, sizes), and for a quantizing tile whether
  // it takes the activations (see CutlassSm90Args).
  bool (*can_implement)(const CutlassSm90Args&);
  // Enqueues the fused GEMM: the kernel parameters (TMA descriptors included) are encoded on
  // the host, with no allocation and no call into the driver but the launch. A quantizing tile
  // enqueues the whole op: the quantize kernel for the prefix rows (which also zeroes the
  // counters), then the GEMM as its programmatic dependent. Returns cudaErrorInvalidValue when
  // CUTLASS rejects the problem, else the launch error.
  cudaError_t (*launch)(const CutlassSm90Args&, void* workspace, cudaStream_t);
  // CTAs per cluster (2: the two CTAs of a cluster share each weight tile by multicast), all
  // along the tokens.
  int cluster_ctas;
  // Tokens per CTA tile (the tile's first extent, its second with the operands swapped).
  int block_m;
  // Channels per CTA tile (the tile's second extent, its first with the operands swapped).
  int block_n;
  // Whether the weights are the GEMM's A operand (TileConfig::kSwapAB).
  bool swaps_operands;
  // The configuration as a request's explanation names it, from its CUTLASS types (e.g.
  // "128x128x128 pingpong, 2x1 cluster").
  const char* (*name)();
};

// The entry points of one configuration for output type y (null for an unknown type).
const TileOps* tile_64x128x128_pingpong(ElemType y);
const TileOps* tile_128x128x128_pingpong(ElemType y);
const TileOps* tile_128x256x128_coop(ElemType y);
const TileOps* tile_64x64x128_pingpong(ElemType y);
const TileOps* tile_64x256x128_pingpong(ElemType y);
const TileOps* tile_128x128x128_pingpong_q(ElemType y);
const TileOps* tile_64x256x128_pingpong_q(ElemType y);
const TileOps* tile_64x128x128_pingpong_c2(ElemType y);
const TileOps* tile_16x64x256_pingpong_swap(ElemType y);
const TileOps* tile_16x64x512_pingpong_swap(ElemType y);
const TileOps* tile_16x128x256_pingpong_swap(ElemType y);
const TileOps* tile_16x64x256_streamk_swap(ElemType y);
const TileOps* tile_16x64x256_claim_swap(ElemType y);
const TileOps* tile_16x64x512_claim_swap(ElemType y);
const TileOps* tile_16x64x256_whole_swap(ElemType y);
const TileOps* tile_16x64x256_whole_swap_q(ElemType y);

// Rows of activations that a buffer for m tokens holds so that every tile's token blocks lie
// inside it (CutlassSm90Args::xq_rows): m rounded up to 128, the largest tile's token block.
inline constexpr int64_t kXqRowAlign = 128;
inline constexpr int64_t xq_rows_for(int64_t m) {
  return (m + kXqRowAlign - 1) / kXqRowAlign * kXqRowAlign;
}

// The token blocks of m tokens on a tile of block_m tokens per CTA, and whether they all fit in
// one cluster of a tile with block_m tokens per CTA
// and cluster_m CTAs per cluster along the tokens: each weight tile is then read once, by one CTA
// or by one cluster through multicast.
inline constexpr int64_t token_blocks(int64_t m, int block_m) {
  return (m + block_m - 1) / block_m;
}
inline constexpr bool token_blocks_fit_cluster(int64_t m, int block_m, int cluster_m) {
  return token_blocks(m, block_m) <= cluster_m;
}

// Whether a call of m tokens on `tile` launches the GEMM as the quantize kernel's programmatic
// dependent (cutlass_sm90_gemm.cc, with the measurements behind it).
bool served_with_pdl(int64_t m, const TileOps& tile);

// The CTA tiles of a call of m tokens on an n-channel layer.
inline constexpr int64_t tile_count(int64_t m, int64_t n, const TileOps& tile) {
  return token_blocks(m, tile.block_m) * ((n + tile.block_n - 1) / tile.block_n);
}

// Whether the quantize kernel before the GEMM may split each of a call's m rows of k 16-bit
// values among several blocks (launch_quantize_s8's `split`; cutlass_sm90_gemm.cc, with the
// measurements behind it), on a GPU of sm_count SMs.
bool split_quantize_rows(int64_t m, int64_t k, int sm_count);

// Whether tiles 14 and 15 deal a call's channels in halves of 32 (CutlassSm90Args::half_tiles;
// cutlass_sm90_tile_16x64x256_streamk.cu).
bool whole_tiles_in_halves(const CutlassSm90Args& a);

inline const TileOps* tile_ops(CutlassSm90Tile tile, ElemType y) {
  switch (tile) {
    case CutlassSm90Tile::k64x128x128Pingpong:
      return tile_64x128x128_pingpong(y);
    case CutlassSm90Tile::k128x128x128Pingpong:
      return tile_128x128x128_pingpong(y);
    case CutlassSm90Tile::k128x256x128Coop:
      return tile_128x256x128_coop(y);
    case CutlassSm90Tile::k64x64x128Pingpong:
      return tile_64x64x128_pingpong(y);
    case CutlassSm90Tile::k64x256x128Pingpong:
      return tile_64x256x128_pingpong(y);
    case CutlassSm90Tile::k128x128x128PingpongQ:
      return tile_128x128x128_pingpong_q(y);
    case CutlassSm90Tile::k64x256x128PingpongQ:
      return tile_64x256x128_pingpong_q(y);
    case CutlassSm90Tile::k64x128x128PingpongC2:
      return tile_64x128x128_pingpong_c2(y);
    case CutlassSm90Tile::k16x64x256PingpongSwap:
      return tile_16x64x256_pingpong_swap(y);
    case CutlassSm90Tile::k16x64x512PingpongSwap:
      return tile_16x64x512_pingpong_swap(y);
    case CutlassSm90Tile::k16x128x256PingpongSwap:
      return tile_16x128x256_pingpong_swap(y);
    case CutlassSm90Tile::k16x64x256StreamKSwap:
      return tile_16x64x256_streamk_swap(y);
    case CutlassSm90Tile::k16x64x256ClaimSwap:
      return tile_16x64x256_claim_swap(y);
    case CutlassSm90Tile::k16x64x512ClaimSwap:
      return tile_16x64x512_claim_swap(y);
    case CutlassSm90Tile::k16x64x256WholeSwap:
      return tile_16x64x256_whole_swap(y);
    case CutlassSm90Tile::k16x64x256WholeSwapQ:
      return tile_16x64x256_whole_swap_q(y);
  }
  return nullptr;
}

}  // namespace cutlass_sm90
}  // namespace qlinear::gpu
