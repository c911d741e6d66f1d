// cuda.cutlass_sm90, tile 16 x 64 x 256 with the operands swapped on a stream-K schedule: a kernel
// of our own beside the CUTLASS tiles (CUTLASS's ping-pong kernel takes every tile's whole K from
// its tile scheduler, and its stream-K scheduler is for the cooperative kernel only).
//
// The work is the layer's (64-channel tile, 256-byte k-tile) pairs, tile after tile, K fastest,
// cut into `grid` contiguous ranges of equal length, one per CTA: every SM streams the same bytes
// of weights, where whole tiles dealt in turn leave SMs idle in a last, partial wave. A tile whose
// k-tiles two or more CTAs share is summed in 64-bit words of a workspace, one per element: each
// share adds its int32 partial sums (two's complement, wrapping into bits 32-39) and one count in
// bits 40 and up; the share that brings the count to the number of shares applies the epilogue
// and clears the word, so the workspace is all zeros again after every call.
//
// Per CTA: one producer warp issuing TMA loads (the weights in boxes of 64 rows x 128 bytes, the
// activations in boxes of 16 rows x 128 bytes, 128-byte swizzle; where K is a multiple of 128, one
// 3-D box of both 128-byte chunks of a k-tile per operand) into a ring of kStages k-tiles,
// and one consumer warpgroup multiplying each k-tile with eight wgmma m64n16k32 (s8 x s8 -> s32,
// both operands from shared memory), then applying the fused epilogue of CutlassSm90Args to the
// channels and tokens it owns.
//
// Not served: it is not among the kCutlassSm90Tiles that a layer times at load. Measured on the
// H200 (bench --swap, in turns, three rounds, us; the GEMM alone / the op as the quantize kernel's
// dependent with 4 k-tiles of weights ahead; this kernel, then the fastest CUTLASS swapped tile):
//   M = 1          stream-K                 CUTLASS
//   6144 x 4096    14.3-14.6 / 16.6-16.9    12.2-12.5 / 12.9-13.0
//   4096 x 4096    11.8-12.0 / 14.6-14.8    10.2-10.3 / 11.3-11.4
//   28672 x 4096   33.7-34.0 / 37.3-37.4    33.0-33.1 / 32.6
//   4096 x 14336   22.1-22.2 / 25.5-25.7    20.0-20.2 / 21.1-21.2
//   8192 x 8192    23.1-23.2 / 26.6-26.9    22.0-22.1 / 21.7-21.9
//   57344 x 8192   109.9 / 113.5-113.7      111.0-111.1 / 110.4-110.7
//   8192 x 28672   59.6-59.9 / 63.7-64.0    58.4-58.6 / 58.7-59.0
//   M = 16
//   6144 x 4096    15.4-15.6 / 18.1-18.2    12.4-12.5 / 13.0-13.2
//   4096 x 4096    12.8-13.0 / 15.9-16.0    10.2-10.3 / 11.3-11.5
//   28672 x 4096   36.6 / 38.8-39.1         33.2-33.7 / 32.9
//   4096 x 14336   24.5-24.8 / 27.6-27.8    20.1-20.2 / 21.3
//   8192 x 8192    25.2-25.5 / 28.8-29.1    21.7 / 22.3-22.6
//   57344 x 8192   114.8-115.1 / 118.7-119.0  111.6 / 110.5
//   8192 x 28672   61.0-61.3 / 64.7-64.9    57.7-58.1 / 60.2-60.6
// (y identical in every round). Alone it wins only on 57344 x 8192 at M = 1. As the dependent it
// loses 3-4 us more than alone, where the CUTLASS tiles lose 0-1. Its CTAs' %globaltimer stamps
// (CutlassSm90Args::trace, bench --streamk) show every CTA starting within 0.2 us of the first, as
// the dependent too, so no CTA starts late on the quantize kernel's SMs; giving the last CTAs a
// smaller share gained nothing that held (57344 x 8192, M = 16, the op: 118.7 us equal, 123.4 /
// 127.1 / 133.0 / 130.1 with 3 / 2 / 1 / 0 quarters of a share) and was not kept. Instead, on
// 8192 x 28672 at M = 1 (us from the first CTA's start): each CTA's first k-tile arrived 2.2 us
// after its start alone and 5.5-5.7 as the dependent, the stream waiting for the quantize kernel
// with only 4 ring slots issued; and equal shares did not end together (multiplies done at 52.9 /
// 55.9, the median CTA / the last). So as the dependent it prefetches the weights after its first
// ring slots into L2 before the wait (weight_prefetch_bytes, as the CUTLASS tiles do): with 64 KB
// the op at M = 1 took 0.8-1.5 us less on the four largest layers (bench --streamk: 28672 x 4096
// 37.2 -> 36.4, 57344 x 8192 116.2 -> 114.7, 8192 x 28672 65.1 -> 63.8) and 0.3-0.4 us more on
// 6144 x 4096 and 4096 x 4096, still behind the CUTLASS tile (33.1, 111.7, 60.4 in that run).
// At 16 tokens a share of a shared tile makes 8 atomic adds per thread, issued together: in a build
// that waited for each before the next, the epilogue took 6.8 us of the GEMM's 16.9 on 4096 x 4096
// at M = 16 (10.1 without it). Working out each k-tile's tile and offset with 64-bit divisions in
// the producer made the GEMM take up to 17% longer (57344 x 8192 at M = 1, alone: 129.0 us, against
// 109.9 counting them). What is left to try: shares handed out while the kernel runs (a slow SM
// taking fewer), and a cheaper sum than an atomic round trip at the end of every shared tile. One
// more open question before it could be served: a diagnostic build whose consumer skipped the
// multiplies (releasing each k-tile as soon as it arrived) hung at 28672 x 4096, M = 16, in three
// runs out of three; the measured build (whose default path this kernel is) ran every benchmark
// layer and its test without a hang, and why the other hung is not understood.
//
// The same kernel with whole tiles per CTA (Params::whole_tiles) is tile 14 (k16x64x256WholeSwap):
// CTA c takes tiles [c * tiles / grid, (c + 1) * tiles / grid) (or, where the tiles outnumber the
// CTAs and it evens their shares, halves of 32 channels: Params::half_tiles), nothing shared, no
// workspace, and two consumer warpgroups take its k-tiles in turn (kWholeTileGroups). Its launch
// costs 1.1 us besides its stream where the CUTLASS tile's costs 2.9; alone it is the faster on
// most benchmark layers, but as the quantize kernel's dependent the weights it issues before the
// wait delay that kernel's end, and it is slower on most; it is not among the tiles a layer times
// (docs/kernels.md, "A kernel of our own dealing whole tiles", with the H200 tables).
//
// Tile 15 (k16x64x256WholeSwapQ) is tile 14 with the activations quantized inside the launch
// (Params::quantize): the whole op in one kernel, so no grid dependency at all. Each CTA's
// producer warp copies the call's rows of 16-bit x into shared memory (one bulk copy, issued before
// its ring's first weights) and then streams the weights as tile 14's does; kQuantWarps more warps
// take each row's parameters as the quantize kernel would and quantize the k-tiles' activations
// into their ring slots in turn, each before the slot's second arrival (quantizer); CTA 0 writes
// sa and azp. Every CTA reads all of x, so a small served call whose x lies in pinned host memory
// takes another tile (cutlass_sm90_gemm.cc).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cluster_launch.h"
#include "kernels/cuda/cutlass_sm90_device.h"
#include "kernels/cuda/epilogue_s32_device.cuh"
#include "kernels/cuda/quantize_s8_device.cuh"
#include "kernels/cuda/sm90_async_device.cuh"
#include "kernels/cuda/stream_s8_device.h"

namespace qlinear::gpu::cutlass_sm90 {
namespace {

constexpr int kRows = 64;             // channels per tile (the MMA's M)
constexpr int kHalfRows = kRows / 2;  // channels per half tile (Params::half_tiles)
constexpr int kTokens = 16;           // tokens per tile (the MMA's N)
constexpr int kKTile = 256;           // bytes of K per k-tile
constexpr int kBox = 128;             // bytes of K per TMA box (the swizzle's width)
constexpr int kStages = 10;           // k-tiles in flight per CTA (11 measured slower, see tile 14)
constexpr int kWBytes = kRows * kKTile;
constexpr int kXBytes = kTokens * kKTile;
constexpr int kStageBytes = kWBytes + kXBytes;  // a multiple of 1024: every box swizzle-aligned
constexpr int kConsumers = 128;                 // per consumer warpgroup
// Tile 14's consumer warpgroups, taking the k-tiles in turn: one warpgroup's multiplies of a k-tile
// (eight wgmma, then the wait for them) held its stream. Measured on the H200 (bench --fixed_cost,
// 64 CTAs of 4096 x 4096, K = 4096, the GEMM alone, in one run: one group 11.5 us, two 10.6; from
// the first k-tile's arrival to the last multiplies 5.5 us against 4.4; in another run, a consumer
// that multiplied nothing 9.5 against 11.6). The stream-K deal (tile 11) keeps one.
constexpr int kWholeTileGroups = 2;
constexpr int kMaxGroups = 2;
// The quantizing form's warps that quantize the activations into the ring (quantizer), taking its
// k-tiles in turn. One warp's chain of loads, conversions, stores, fence and arrival per k-tile
// held the stream: measured on the H200 (bench --streamk, M = 1, the op, us), one warp 11.5 on
// 4096 x 4096, 12.4 on 6144 x 4096, 21.8 on 8192 x 8192 and 111.6 on 57344 x 8192; four warps
// 10.5, 12.1, 21.5 and 108.4 (tile 14's GEMM alone: 10.6, 12.1, 21.3, 108.5).
constexpr int kQuantWarps = 4;
// The consumers, the producer warp and the quantizing form's warps.
constexpr int kThreads = kMaxGroups * kConsumers + 32 + kQuantWarps * 32;
static_assert(kWholeTileGroups >= 1 && kWholeTileGroups <= kMaxGroups && kMaxGroups == 2,
              "the groups' named barriers count 2 x kConsumers threads");
constexpr int kRedOffset = kStages * kStageBytes + 256;  // the groups' sums, after the barriers
constexpr int kSmemBytes = kRedOffset + kConsumers * 8 * 4 + 1024;
// The quantizing form (tile 15): each row's quantization parameters (device::RowParams), then the
// CTA's copy of the rows of x (m * K * 2 bytes, at most kXRowBytes; a launch takes what its rows
// need).
constexpr int kRowParamsOffset = kRedOffset + kConsumers * 8 * 4;
constexpr int kXRowsOffset = kRowParamsOffset + 512;
static_assert(sizeof(device::RowParams) * kTokens <= 512, "the rows' parameters");
constexpr int kXRowBytes = 20480;
constexpr int kSmemBytesQ = kXRowsOffset + kXRowBytes + 1024;
static_assert(kSmemBytesQ <= 232448, "shared memory per block on sm_90");
constexpr int kWordsPerTile = kRows * kTokens;
constexpr int kCountShift = 40;
// Independent accumulators per k-tile (k-step j into chain j % kChains), summed at the end of each
// tile's share: 1, 2, 4 and 8 measured alike on the H200, and 4 is what was timed last.
constexpr int kChains = 4;

struct Params {
  StreamTmaMap wmap;  // weights [n, k], boxes of 64 rows
  StreamTmaMap xmap;  // activations [rows, k], boxes of 16 rows
  const float* sa;
  const int32_t* azp;
  const float* sb;
  const int32_t* adj;
  const float* bias_v;
  void* y;
  uint64_t* ws;
  uint64_t* trace;  // CutlassSm90Args::trace: kStreamKTracePoints per CTA, or null
  int64_t units;    // tiles * kt
  int m, n, kt, grid;
  int k8;        // K / 8: 16-byte vectors of a 16-bit activation row (the quantizing form)
  int ahead;     // with pdl: the ring slots whose weights are issued before the dependency wait
  int l2_ahead;  // with pdl: the units after those whose weights are prefetched into L2 then
  ElemType y_type;
  bool pdl;
  // Both maps 3-D (128 bytes of K, rows, 128-byte chunks of K; K a multiple of 128): one load
  // per operand and k-tile instead of two 2-D boxes (which cap a plain read at about 40 GB/s per
  // CTA, docs/kernels.md "How fast one SM streams"; in this kernel the two forms measured alike).
  bool chunked;
  // Whole tiles per CTA (tile 14): CTA c takes tiles [c * tiles / grid, (c + 1) * tiles / grid),
  // so that no tile is shared and the workspace is never touched.
  bool whole_tiles;
  // With whole tiles: the channels dealt in halves of kHalfRows instead (CTA c takes halves
  // [c * halves / grid, (c + 1) * halves / grid)), a range's odd first half and its last half
  // multiplied as a tile of their own, where that shortens the longest CTA's share
  // (half_tiles_pay). A half tile's weights come through wmap_half (boxes of kHalfRows rows); its
  // wgmma still multiply 64 rows, and the rows past its 32 are never stored.
  bool half_tiles;
  int64_t halves;
  StreamTmaMap wmap_half;
  // Consumer warpgroups, taking the k-tiles in turn (kWholeTileGroups with whole tiles, else 1).
  int groups;
  // The quantizing form (tile 15, with whole tiles): x [m, k] (bf16 or fp16, row-major, 16-byte
  // aligned) quantized inside the launch, no grid dependency (quantizer); CTA 0 also
  // writes sa and azp (the rows' outputs, at sa_out and azp_out).
  bool quantize;
  const void* x;
  ElemType x_type;
  QuantizeParams qp;
  float* sa_out;
  int32_t* azp_out;
};

// The CTA whose range holds unit u.
__device__ __forceinline__ int owner_of(int64_t u, int64_t units, int grid) {
  return static_cast<int>(((u + 1) * grid - 1) / units);
}

// With whole tiles, whether the tile at half h of a CTA's halves [.., h_end) is a half tile: it
// starts at an odd half, or it is the range's last half.
__device__ __forceinline__ bool half_at(const Params& p, int64_t h, int64_t h_end) {
  return p.half_tiles && ((h & 1) != 0 || h + 1 == h_end);
}

// %globaltimer into the CTA's trace point `point` (benchmarks only).
__device__ __forceinline__ void stamp(const Params& p, int point) {
  if (p.trace == nullptr) return;
  p.trace[static_cast<int64_t>(blockIdx.x) * kStreamKTracePoints + point] = device::globaltimer();
}

__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  // K-major, 128-byte swizzle: 8-row groups 1024 bytes apart (stride byte offset), the leading
  // byte offset unused.
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_64x16x32(int32_t (&d)[8], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8"
      " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p;\n}"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7])
      : "l"(a), "l"(b), "r"(accumulate)
      : "memory");
}

// The quantizing warps of the quantizing form (warp `qw` of kQuantWarps, lane `lane`; the CTA's
// `left` units from k-tile kk): each row's statistics and parameters from the rows of x the
// producer copied into shared memory, one warp per row (into shared memory for the epilogue; CTA 0
// also writes sa and azp out as the quantize kernel does, azp not for a bad row); then the CTA's
// k-tiles in turn among the warps, each quantized into its ring slot once the consumers have freed
// it (zeros past K and for a row that is not kQuantize), before the slot's second arrival. The
// producer issues the weights on its own, so the ring's loads never wait for these warps.
template <typename T, QuantScheme S>
__device__ __forceinline__ void quantizer(const Params& p, uint8_t* smem, uint32_t full,
                                          uint32_t empty, int qw, int lane, int kk, int64_t left) {
  const uint8_t* xs = smem + kXRowsOffset;
  const int row_bytes = p.k8 * 16;  // K * 2
  device::RowParams* rps = reinterpret_cast<device::RowParams*>(smem + kRowParamsOffset);
  device::mbar_wait(empty + kStages * 8, 0);  // the rows of x
  for (int r = qw; r < p.m; r += kQuantWarps) {
    const uint4* row = reinterpret_cast<const uint4*>(xs + r * row_bytes);
    device::WarpRowStats<T, S> st;
    for (int v = lane; v < p.k8; v += 32) st.visit8(row[v]);
    const device::RowParams rp = device::row_params<S>(st.reduce(), p.qp);
    if (lane == 0) {
      rps[r] = rp;
      if (blockIdx.x == 0) {
        p.sa_out[r] = rp.sa;
        if (p.azp_out != nullptr && rp.mode != device::kBadRow) p.azp_out[r] = rp.zp;
      }
    }
  }
  asm volatile("bar.sync 3, %0;" ::"n"(kQuantWarps * 32) : "memory");
  if (qw == 0 && lane == 0) stamp(p, 1);
  // This warp's first k-tile: the CTA's k-tile qw, in slot qw of the first round.
  int s = qw, kq = kk + qw;
  uint32_t round = 0;
  while (kq >= p.kt) kq -= p.kt;
  for (int64_t j = qw; j < left; j += kQuantWarps) {
    if (round > 0) device::mbar_wait(empty + 8 * s, (round - 1) & 1);
    // The k-tile's activations where the 3-D TMA box would have put them: two 128-byte chunks of
    // 16 rows, each row's 16-byte units swizzled by the row (rows m..15 left as they are: their
    // products land in accumulator columns never stored). Each lane quantizes 8 values of a row.
    uint8_t* slot = smem + s * kStageBytes + kWBytes;
    for (int e = lane; e < p.m * 32; e += 32) {
      const int r = e >> 5, u = e & 31;
      const int col = kq * kKTile + u * 8;  // the first of the 8 values
      const device::RowParams rp = rps[r];
      uint2 q = make_uint2(0u, 0u);
      if (col < p.k8 * 8 && rp.mode == device::kQuantize) {
        q = device::quantize8<T, S>(*reinterpret_cast<const uint4*>(xs + r * row_bytes + col * 2),
                                    rp);
      }
      const int c = u >> 4, unit = (u & 15) >> 1;
      *reinterpret_cast<uint2*>(slot + c * (kTokens * kBox) + r * kBox + ((unit ^ (r & 7)) * 16) +
                                (u & 1) * 8) = q;
    }
    device::fence_proxy_async_shared();  // for the consumers' wgmma (the async proxy)
    __syncwarp();
    if (lane == 0) device::mbar_arrive(full + 8 * s);
    kq += kQuantWarps;
    while (kq >= p.kt) kq -= p.kt;
    s += kQuantWarps;
    if (s >= kStages) {
      s -= kStages;
      ++round;
    }
  }
}

template <typename T>
__device__ __forceinline__ void quantizer(const Params& p, uint8_t* smem, uint32_t full,
                                          uint32_t empty, int qw, int lane, int kk, int64_t left) {
  switch (p.qp.scheme) {
    case QuantScheme::kDynamicSymmetric:
      return quantizer<T, QuantScheme::kDynamicSymmetric>(p, smem, full, empty, qw, lane, kk, left);
    case QuantScheme::kStaticSymmetric:
      return quantizer<T, QuantScheme::kStaticSymmetric>(p, smem, full, empty, qw, lane, kk, left);
    case QuantScheme::kDynamicAsymmetric:
      return quantizer<T, QuantScheme::kDynamicAsymmetric>(p, smem, full, empty, qw, lane, kk,
                                                           left);
    case QuantScheme::kStaticAsymmetric:
    default:
      return quantizer<T, QuantScheme::kStaticAsymmetric>(p, smem, full, empty, qw, lane, kk, left);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    streamk_swap_kernel(const __grid_constant__ Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  const uint32_t base = device::smem_addr(smem);
  const uint32_t full = base + kStages * kStageBytes;
  const uint32_t empty = full + kStages * 8;
  const int cta = blockIdx.x;
  if (threadIdx.x == 0) stamp(p, 0);
  // The CTA's units: with whole tiles, its tiles' k-tiles counted from 0 (the tiles themselves
  // are its halves [h_begin, h_end)); on the stream-K deal, its range of all the units.
  int64_t u_begin, u_end, h_begin = 0, h_end = 0;
  if (p.whole_tiles) {
    if (p.half_tiles) {
      h_begin = static_cast<int64_t>(cta) * p.halves / p.grid;
      h_end = static_cast<int64_t>(cta + 1) * p.halves / p.grid;
    } else {
      const int64_t tiles = p.units / p.kt;
      h_begin = 2 * (static_cast<int64_t>(cta) * tiles / p.grid);
      h_end = 2 * (static_cast<int64_t>(cta + 1) * tiles / p.grid);
    }
    int64_t tiles = 0;
    for (int64_t h = h_begin; h < h_end; h += half_at(p, h, h_end) ? 1 : 2) ++tiles;
    u_begin = 0;
    u_end = tiles * p.kt;
  } else {
    u_begin = static_cast<int64_t>(cta) * p.units / p.grid;
    u_end = static_cast<int64_t>(cta + 1) * p.units / p.grid;
  }

  const int producer = p.groups * kConsumers;
  if (threadIdx.x == producer) {
    // The descriptors into the TMA unit's cache while the barriers are set up.
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&p.wmap)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&p.xmap)) : "memory");
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // (The quantizing form: the weights' expect_tx and the activations' arrival.)
      device::mbar_init(full + 8 * s, p.quantize ? 2 : 1);
      device::mbar_init(empty + 8 * s, 1);
    }
    device::mbar_init(empty + kStages * 8, 1);  // the quantizing form's rows of x
    device::mbar_init_fence();
  }
  __syncthreads();

  if (threadIdx.x >= producer) {
    // The producer warp: one thread issues every load. The quantizing form's kQuantWarps warps
    // after it quantize the activations into the ring's slots (quantizer).
    if (threadIdx.x != producer && threadIdx.x < producer + 32) return;
    const uint64_t w_policy = device::l2_evict_first();
    const uint64_t x_policy = device::l2_evict_last();
    // The weights of k-tile kk of the tile at channel `row` (a half tile's: half) into ring slot
    // s, completing on its full barrier.
    constexpr int kChunks = kKTile / kBox;
    auto issue_w = [&](int row, bool half, int kk, int s) {
      const uint32_t dst = base + s * kStageBytes;
      const StreamTmaMap* map = half ? &p.wmap_half : &p.wmap;
      if (p.chunked) {
        device::tma_load_3d(dst, map, 0, row, kk * kChunks, full + 8 * s, w_policy);
        return;
      }
      const int rows = half ? kHalfRows : kRows;
      for (int b = 0; b < kKTile / kBox; ++b) {
        device::tma_load_2d(dst + b * (rows * kBox), map, kk * kKTile + b * kBox, row, full + 8 * s,
                            w_policy);
      }
    };
    auto issue_x = [&](int kk, int s) {
      const uint32_t dst = base + s * kStageBytes + kWBytes;
      if (p.chunked) {
        device::tma_load_3d(dst, &p.xmap, 0, 0, kk * kChunks, full + 8 * s, x_policy);
        return;
      }
      for (int b = 0; b < kKTile / kBox; ++b) {
        device::tma_load_2d(dst + b * (kTokens * kBox), &p.xmap, kk * kKTile + b * kBox, 0,
                            full + 8 * s, x_policy);
      }
    };
    // The producer's place: the tile (with whole tiles, its first half hc and whether it is a
    // half tile), the k-tile, the ring slot and round, and the units left.
    int tile = static_cast<int>(u_begin / p.kt), kk = static_cast<int>(u_begin % p.kt);
    int64_t hc = h_begin;
    bool half = p.whole_tiles && half_at(p, hc, h_end);
    auto row_at = [&](int t, int64_t h) {
      return p.whole_tiles ? static_cast<int>(h * kHalfRows) : t * kRows;
    };
    auto w_bytes = [](bool is_half) { return is_half ? kWBytes / 2 : kWBytes; };
    int s = 0;
    uint32_t round = 0;
    int64_t left = u_end - u_begin;
    auto next = [&] {
      if (++kk == p.kt) {
        kk = 0;
        ++tile;
        if (p.whole_tiles) {
          hc += half ? 1 : 2;
          half = half_at(p, hc, h_end);
        }
      }
      if (++s == kStages) {
        s = 0;
        ++round;
      }
      --left;
    };
    if (threadIdx.x >= producer + 32) {
      const int qt = threadIdx.x - producer - 32;
      if (p.x_type == ElemType::kF16) {
        quantizer<__half>(p, smem, full, empty, qt / 32, qt % 32, kk, left);
      } else {
        quantizer<__nv_bfloat16>(p, smem, full, empty, qt / 32, qt % 32, kk, left);
      }
      return;
    }
    if (p.quantize) {
      // The rows of x by one bulk copy, ahead of the ring's first weights in the memory system.
      const uint32_t xbar = empty + kStages * 8;
      const int row_bytes = p.k8 * 16;
      device::mbar_expect_tx(xbar, static_cast<uint32_t>(p.m * row_bytes));
      for (int r = 0; r < p.m; ++r) {
        device::bulk_copy(base + kXRowsOffset + r * row_bytes,
                          static_cast<const uint8_t*>(p.x) + static_cast<int64_t>(r) * row_bytes,
                          static_cast<uint32_t>(row_bytes), xbar, x_policy);
      }
    } else if (p.pdl) {
      // The weights of the first ring slots before the wait, the activations after it.
      const int first = static_cast<int>(left < p.ahead ? left : p.ahead);
      const int kk0 = kk;
      for (int j = 0; j < first; ++j) {
        device::mbar_expect_tx(full + 8 * s, w_bytes(half) + kXBytes);
        issue_w(row_at(tile, hc), half, kk, s);
        next();
      }
      // The next l2_ahead units' weights into L2, so that DRAM keeps streaming while the ring
      // waits for the activations.
      {
        int pt = tile, pk = kk;
        int64_t ph = hc;
        bool phalf = half;
        const int64_t count = left < p.l2_ahead ? left : p.l2_ahead;
        for (int64_t j = 0; j < count; ++j) {
          const StreamTmaMap* map = phalf ? &p.wmap_half : &p.wmap;
          const int prow = row_at(pt, ph);
          if (p.chunked) {
            device::tma_prefetch_3d(map, 0, prow, pk * kChunks);
          } else {
            for (int b = 0; b < kKTile / kBox; ++b) {
              device::tma_prefetch_2d(map, pk * kKTile + b * kBox, prow);
            }
          }
          if (++pk == p.kt) {
            pk = 0;
            ++pt;
            if (p.whole_tiles) {
              ph += phalf ? 1 : 2;
              phalf = half_at(p, ph, h_end);
            }
          }
        }
      }
      device::grid_dependency_wait();
      stamp(p, 1);
      int kx = kk0;
      for (int j = 0; j < first; ++j) {
        issue_x(kx, j);
        if (++kx == p.kt) kx = 0;
      }
    } else {
      stamp(p, 1);
    }
    while (left > 0) {
      if (round > 0) device::mbar_wait(empty + 8 * s, (round - 1) & 1);
      device::mbar_expect_tx(full + 8 * s, w_bytes(half) + (p.quantize ? 0 : kXBytes));
      issue_w(row_at(tile, hc), half, kk, s);
      if (!p.quantize) issue_x(kk, s);
      next();
    }
    stamp(p, 2);
    return;
  }

  // The consumer warpgroup. Accumulator d[4j + h * 2 + c]: channel row0 + 8h, token col0 + 8j + c.
  const int wg = threadIdx.x / kConsumers, ct = threadIdx.x % kConsumers;
  const int warp = ct / 32, lane = ct % 32;
  const int row0 = warp * 16 + lane / 4, col0 = (lane % 4) * 2;
  // Accumulator e's row in the tile (channel) and column (token).
  auto row_of = [&](int e) { return row0 + 8 * ((e >> 1) & 1); };
  auto token_of = [&](int e) { return col0 + 8 * (e >> 2) + (e & 1); };
  // The per-token operands of this thread's four tokens (col0 + (j & 1) + 8 * (j >> 1)), from the
  // quantize kernel: the first multiply waits for its activations anyway.
  // (The quantizing form: from the quantizing warps, through shared memory, at the first epilogue:
  // group 0, which applies every epilogue, has then waited for k-tile 0, whose activations
  // quantizing warp 0 wrote after every row's parameters were written, named barrier 3 between.)
  if (p.pdl) device::grid_dependency_wait();
  float sa_t[4];
  int32_t azp_t[4];
  bool row_params_loaded = !p.quantize;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int t = col0 + (j & 1) + 8 * (j >> 1);
    // (Written by the quantize kernel during this grid's life: through L2, not the read-only
    // path, which assumes data constant while the grid runs.)
    sa_t[j] = !p.quantize && t < p.m ? __ldcg(p.sa + t) : 0.f;
    azp_t[j] = !p.quantize && t < p.m && p.azp != nullptr ? __ldcg(p.azp + t) : 0;
  }
  int64_t i = 0;  // k-tiles consumed
  int shared_tiles = 0;
  int64_t hc = h_begin;  // with whole tiles, the next tile's first half
  for (int64_t u = u_begin; u < u_end;) {
    // The tile's k-tiles [u, seg_end) (all of them where whole), its first channel and its rows.
    int tile = 0, row_base = 0, rows = kRows;
    int64_t tile_end = 0, seg_end = 0;
    bool whole = true;
    if (p.whole_tiles) {
      const bool half = half_at(p, hc, h_end);
      row_base = static_cast<int>(hc * kHalfRows);
      rows = half ? kHalfRows : kRows;
      hc += half ? 1 : 2;
      seg_end = u + p.kt;
    } else {
      tile = static_cast<int>(u / p.kt);
      tile_end = static_cast<int64_t>(tile + 1) * p.kt;
      seg_end = tile_end < u_end ? tile_end : u_end;
      whole = u == static_cast<int64_t>(tile) * p.kt && seg_end == tile_end;
      row_base = tile * kRows;
    }
    // The per-channel operands of this thread's two channels (row0 + 8h), loaded before the
    // k-loop so that their latency hides behind it.
    float sb_c[2], bias_c[2];
    int32_t adj_c[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int ch = row_base + row0 + 8 * h;
      const bool in = ch < p.n;
      sb_c[h] = in ? __ldg(p.sb + ch) : 0.f;
      bias_c[h] = in ? __ldg(p.bias_v + ch) : 0.f;
      adj_c[h] = in && p.adj != nullptr ? __ldg(p.adj + ch) : 0;
    }
    int32_t dc[kChains][8];
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
#pragma unroll
      for (int j = 0; j < 8; ++j) dc[c][j] = 0;
    }
    for (; u < seg_end; ++u, ++i) {
      if (p.groups == 2 && static_cast<int>(i & 1) != wg) continue;
      const int s = static_cast<int>(i % kStages);
      device::mbar_wait(full + 8 * s, static_cast<uint32_t>(i / kStages) & 1);
      if (i == 0 && threadIdx.x == 0) stamp(p, 3);
      const uint32_t w = base + s * kStageBytes, x = w + kWBytes;
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
#pragma unroll
        for (int j = 0; j < 8; ++j) asm volatile("" : "+r"(dc[c][j])::"memory");
      }
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int ks = 0; ks < kKTile / 32; ++ks) {
        // (A half tile's chunks lie rows * kBox apart; the wgmma's rows past them are not stored.)
        const int b = ks / (kBox / 32), off = (ks % (kBox / 32)) * 32;
        wgmma_64x16x32(dc[ks % kChains], smem_desc(w + b * (rows * kBox) + off),
                       smem_desc(x + b * (kTokens * kBox) + off), 1);
      }
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
#pragma unroll
        for (int j = 0; j < 8; ++j) asm volatile("" : "+r"(dc[c][j])::"memory");
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      if (ct == 0) device::mbar_arrive(empty + 8 * s);
    }
    if (u == u_end && threadIdx.x == 0) stamp(p, 4);
    int32_t d[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t sum = 0;
#pragma unroll
      for (int c = 0; c < kChains; ++c) sum += static_cast<uint32_t>(dc[c][j]);
      d[j] = static_cast<int32_t>(sum);
    }
    if (p.groups == 2) {
      // The second group's sums into the first's, which applies the epilogue.
      int32_t* red = reinterpret_cast<int32_t*>(smem + kRedOffset);
      if (wg == 1) {
#pragma unroll
        for (int j = 0; j < 8; ++j) red[j * kConsumers + ct] = d[j];
      }
      asm volatile("bar.sync 1, 256;" ::: "memory");
      if (wg == 0) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          d[j] = static_cast<int32_t>(static_cast<uint32_t>(d[j]) +
                                      static_cast<uint32_t>(red[j * kConsumers + ct]));
        }
      }
      asm volatile("bar.sync 2, 256;" ::: "memory");
      if (wg == 1) continue;
    }
    if (!row_params_loaded) {
      const device::RowParams* rps =
          reinterpret_cast<const device::RowParams*>(smem + kRowParamsOffset);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int t = col0 + (j & 1) + 8 * (j >> 1);
        sa_t[j] = t < p.m ? rps[t].sa : 0.f;
        azp_t[j] = t < p.m ? rps[t].zp : 0;
      }
      row_params_loaded = true;
    }
    // The shares of this tile, and its words in the workspace (the slot of its first CTA).
    int shares = 1;
    uint64_t* words = nullptr;
    if (!whole) {
      const int first = owner_of(static_cast<int64_t>(tile) * p.kt, p.units, p.grid);
      const int last = owner_of(tile_end - 1, p.units, p.grid);
      shares = last - first + 1;
      ++shared_tiles;
      words = p.ws + static_cast<int64_t>(first) * kWordsPerTile;
    }
    // A shared tile's sums: every element's atomic add issued before any result is used, so that
    // their round trips overlap; the share that completes an element applies the epilogue to it.
    bool keep[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      keep[e] = token_of(e) < p.m && row_of(e) < rows && row_base + row_of(e) < p.n;
    }
    if (!whole) {
      uint64_t old[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint64_t add = (uint64_t{1} << kCountShift) + static_cast<uint32_t>(d[e]);
        old[e] = keep[e] ? atomicAdd(reinterpret_cast<unsigned long long*>(
                                         words + row_of(e) * kTokens + token_of(e)),
                                     add)
                         : 0;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (keep[e] && static_cast<int>(old[e] >> kCountShift) + 1 == shares) {
          d[e] = static_cast<int32_t>(static_cast<uint32_t>(old[e]) + static_cast<uint32_t>(d[e]));
          words[row_of(e) * kTokens + token_of(e)] = 0;
        } else {
          keep[e] = false;
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (!keep[e]) continue;
      const int h = (e >> 1) & 1, j = (e & 1) + 2 * (e >> 2);
      const int t = token_of(e), ch = row_base + row_of(e);
      const uint32_t zp = static_cast<uint32_t>(azp_t[j]) * static_cast<uint32_t>(adj_c[h]);
      const float tv = __int2float_rn(static_cast<int32_t>(static_cast<uint32_t>(d[e]) - zp));
      const float v = __fmaf_rn(sa_t[j], __fmul_rn(sb_c[h], tv), bias_c[h]);
      device::store_y(p.y, p.y_type, static_cast<int64_t>(t) * p.n + ch, v);
    }
  }
  if (p.trace != nullptr && threadIdx.x == 0) {
    stamp(p, 5);
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    uint64_t* t = p.trace + static_cast<int64_t>(cta) * kStreamKTracePoints;
    t[6] = (static_cast<uint64_t>(u_end - u_begin) << 32) | sm;
    t[7] = static_cast<uint64_t>(shared_tiles);
  }
}

int64_t tiles_for(const CutlassSm90Args& a) { return (a.n + kRows - 1) / kRows; }

int64_t units_for(const CutlassSm90Args& a) { return tiles_for(a) * ((a.k + kKTile - 1) / kKTile); }

int64_t halves_for(const CutlassSm90Args& a) { return (a.n + kHalfRows - 1) / kHalfRows; }

// Whole tiles dealt in halves (Params::half_tiles) where the tiles outnumber the SMs and halves
// give the busiest CTA fewer channels: 28672 x 4096 (448 tiles on 132 SMs: 4 tiles -> 3.5). Not
// where the tiles about fill the SMs or their last wave (8192 x 8192, 57344 x 8192), nor on layers
// of fewer tiles than SMs: a half tile's k-tile is half the bytes for the same eight wgmma, and on
// 4096 x 4096 (64 tiles -> 128 halves, one per CTA) tile 15's op measured no faster (H200, bench
// --streamk, M = 1, three rounds in turns, us, whole tiles / halves: 11.0 / 11.3, 11.3 / 11.2,
// 11.3 / 11.2) while on 4096 x 14336 tile 14 alone took 25.0 us in halves (22.6-23.4 in whole
// tiles in earlier runs).
bool half_tiles_pay(const CutlassSm90Args& a) {
  if (!a.half_tiles) return false;
  const int64_t sms = a.sm_count > 0 ? a.sm_count : 132;
  const int64_t tiles = tiles_for(a), halves = halves_for(a);
  if (tiles <= sms) return false;
  return (halves + sms - 1) / sms < 2 * ((tiles + sms - 1) / sms);
}

int grid_for(const CutlassSm90Args& a, bool whole_tiles) {
  if (whole_tiles) {
    const int sms = a.sm_count > 0 ? a.sm_count : 132;
    const int64_t tiles = half_tiles_pay(a) ? halves_for(a) : tiles_for(a);
    return static_cast<int>(tiles < sms ? tiles : sms);
  }
  // At most 255 CTAs: a word's low 32 bits carry into bits 32-39 once per share at most.
  const int sms = a.sm_count > 0 ? (a.sm_count < 255 ? a.sm_count : 255) : 132;
  const int64_t units = units_for(a);
  return static_cast<int>(units < sms ? units : sms);
}

cudaError_t prepare() {
  static const cudaError_t e = [] {
    cudaFuncSetAttribute(streamk_swap_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
    return cudaFuncSetAttribute(streamk_swap_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kSmemBytesQ);
  }();
  return e;
}

size_t workspace_bytes(const CutlassSm90Args& a) {
  return static_cast<size_t>(grid_for(a, false)) * kWordsPerTile * sizeof(uint64_t);
}

size_t no_workspace(const CutlassSm90Args&) { return 0; }

// The tokens, sizes and weights every form of the kernel takes.
bool shape_fits(const CutlassSm90Args& a) {
  return a.m >= 1 && a.m <= kTokens && a.n >= 16 && a.n % 16 == 0 && a.k >= 16 && a.k % 16 == 0 &&
         a.n <= (int64_t{1} << 30) && a.k <= (int64_t{1} << 30) &&
         reinterpret_cast<uintptr_t>(a.w) % 16 == 0;
}

bool can_implement(const CutlassSm90Args& a) {
  return shape_fits(a) && reinterpret_cast<uintptr_t>(a.xq) % 16 == 0;
}

// The quantizing form (tile 15): 16-bit x in device memory, its rows within kXRowBytes of shared
// memory (M = 1 up to K = 10240, M = 4 up to K = 2560).
bool can_implement_q(const CutlassSm90Args& a) {
  return shape_fits(a) && a.x != nullptr && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
         (a.x_type == ElemType::kBF16 || a.x_type == ElemType::kF16) && a.sa != nullptr &&
         a.m * a.k * 2 <= kXRowBytes;
}

cudaError_t launch_deal(const CutlassSm90Args& a, void* workspace, cudaStream_t stream,
                        bool whole_tiles, bool quantize = false) {
  if (quantize ? !can_implement_q(a) : !can_implement(a)) return cudaErrorInvalidValue;
  if (workspace == nullptr && !whole_tiles) return cudaErrorInvalidValue;
  if (const cudaError_t e = prepare(); e != cudaSuccess) return e;
  Params p{};
  const int64_t x_rows = a.xq_rows > a.m ? a.xq_rows : a.m;
  // (cuda.stream_s8's descriptors: boxes of 128 bytes x box_rows, 128-byte swizzle, for any
  // rows x k int8 matrix; 3-D, a k-tile's two 128-byte chunks in one box, where K is a multiple of
  // 128 bytes. A last, half k-tile's second chunk lies past K and is filled with zeros.)
  p.chunked = a.k % kBox == 0;
  const int chunks = p.chunked ? kKTile / kBox : 1;
  if (const cudaError_t e = stream_s8_weights_map(a.w, a.n, a.k, &p.wmap, kRows, chunks);
      e != cudaSuccess) {
    return e;
  }
  p.half_tiles = whole_tiles && half_tiles_pay(a);
  p.halves = halves_for(a);
  if (p.half_tiles) {
    if (const cudaError_t e = stream_s8_weights_map(a.w, a.n, a.k, &p.wmap_half, kHalfRows, chunks);
        e != cudaSuccess) {
      return e;
    }
  }
  if (!quantize) {
    if (const cudaError_t e = stream_s8_weights_map(a.xq, x_rows, a.k, &p.xmap, kTokens, chunks);
        e != cudaSuccess) {
      return e;
    }
  }
  p.sa = a.sa;
  p.azp = a.azp;
  p.sb = a.sb;
  p.adj = a.adj;
  p.bias_v = a.bias_v;
  p.y = a.y;
  p.ws = static_cast<uint64_t*>(workspace);
  p.units = units_for(a);
  p.m = static_cast<int>(a.m);
  p.n = static_cast<int>(a.n);
  p.kt = static_cast<int>((a.k + kKTile - 1) / kKTile);
  p.grid = grid_for(a, whole_tiles);
  p.whole_tiles = whole_tiles;
  p.groups = whole_tiles ? kWholeTileGroups : 1;
  p.trace = a.trace;
  p.ahead = a.weights_ahead_stages > 0 && a.weights_ahead_stages < kStages ? a.weights_ahead_stages
                                                                           : kStages;
  if (!a.weights_ahead) p.ahead = 0;
  p.l2_ahead = static_cast<int>(a.weight_prefetch_bytes / kWBytes);
  p.y_type = a.y_type;
  p.pdl = a.pdl && !quantize;  // (the quantizing form depends on no kernel)
  p.quantize = quantize;
  p.x = a.x;
  p.x_type = a.x_type;
  p.qp = a.qp;
  p.sa_out = const_cast<float*>(a.sa);
  p.azp_out = const_cast<int32_t*>(a.azp);
  p.k8 = static_cast<int>(a.k / 8);
  // (The quantizing form takes only the shared memory its rows need.)
  const size_t smem = quantize ? static_cast<size_t>(kXRowsOffset + a.m * a.k * 2 + 1024)
                               : static_cast<size_t>(kSmemBytes);
  const DependentLaunch cfg(static_cast<unsigned>(p.grid),
                            p.groups * kConsumers + 32 + (quantize ? kQuantWarps * 32 : 0), smem,
                            stream, p.pdl);
  return cudaLaunchKernelEx(&cfg.config, streamk_swap_kernel, p);
}

cudaError_t launch(const CutlassSm90Args& a, void* workspace, cudaStream_t stream) {
  return launch_deal(a, workspace, stream, false);
}

cudaError_t launch_whole_tiles(const CutlassSm90Args& a, void* workspace, cudaStream_t stream) {
  return launch_deal(a, workspace, stream, true);
}

cudaError_t launch_whole_tiles_q(const CutlassSm90Args& a, void* workspace, cudaStream_t stream) {
  return launch_deal(a, workspace, stream, true, true);
}

const char* name() { return "16x64x256 stream-K, operands swapped"; }
const char* name_whole_tiles() { return "16x64x256 whole tiles, operands swapped"; }
const char* name_whole_tiles_q() {
  return "16x64x256 whole tiles, operands swapped, activations quantized in the GEMM launch";
}

const TileOps kOps = {prepare, workspace_bytes, can_implement, launch, 1,
                      kTokens, kRows,           true,          name};
const TileOps kWholeTileOps = {prepare, no_workspace, can_implement, launch_whole_tiles, 1,
                               kTokens, kRows,        true,          name_whole_tiles};
const TileOps kWholeTileQOps = {
    prepare, no_workspace, can_implement_q,   launch_whole_tiles_q, 1, kTokens,
    kRows,   true,         name_whole_tiles_q};

}  // namespace

bool whole_tiles_in_halves(const CutlassSm90Args& a) { return half_tiles_pay(a); }

const TileOps* tile_16x64x256_streamk_swap(ElemType y) {
  (void)y;  // the output type is a launch argument
  return &kOps;
}

const TileOps* tile_16x64x256_whole_swap(ElemType y) {
  (void)y;
  return &kWholeTileOps;
}

const TileOps* tile_16x64x256_whole_swap_q(ElemType y) {
  (void)y;
  return &kWholeTileQOps;
}

}  // namespace qlinear::gpu::cutlass_sm90
