// The device half of cuda.stream_s8 (see stream_s8.h): the int8 GEMM and fused epilogue for small
// M, streaming the weights through a shared-memory ring filled by bulk copies.
//
// Compiled by nvcc and by the host compiler: plain C++ only (see quantize_s8.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/quantize_s8.h"

namespace qlinear::gpu {

// The largest M the kernel takes (8 tokens per mma.sync n-block, at most 4 blocks).
inline constexpr int64_t kStreamMaxM = 32;
// A work unit: kStreamRows weight rows x kStreamChunk bytes of K (the last chunk of a row may be
// shorter). The units of the layer, row block by row block, are cut into `grid` contiguous ranges
// of equal length, one per block: each block streams long runs of the same rows, which the H200's
// memory serves fastest (handing out smaller pieces to whichever block is free measured 5-20%
// slower), and a row block shared by neighbouring ranges is summed by the last of them to finish.
// Units of 32 rows, which deal most layers' rows out whole to 128 blocks so that no row block is
// shared, streamed the weights slower in their boxes of 32 rows: the op at M = 1 on the H200 took
// 7-81% longer on six of the seven benchmark layers (57344 x 8192 112.6 -> 156.5 and 204.2 us in
// two runs, 28672 x 4096 36.1 -> 47.4 and 61.5) and gained only on 4096 x 4096 in one run (13.3
// -> 12.3, 15.2 in the other; docs/kernels.md, "What bounds the swapped tiles"). Read alone by
// TMA (bench --reads), the weights took 32-72% longer in boxes of 32 rows than in boxes of 64 on
// the four largest layers, and as long in boxes of 128; units of 128 rows x 256 bytes streamed no
// faster than these.
inline constexpr int kStreamRows = 64;
inline constexpr int kStreamChunk = 512;

// A TMA descriptor (CUtensorMap) for the layer's weights, made once per layer by
// stream_s8_weights_map; opaque here so that this header needs no driver API.
struct alignas(64) StreamTmaMap {
  uint64_t opaque[16];
};

// Bytes between a token's rows in a ring slot, and in the quantized activations' layout.
inline constexpr int kStreamXRow = kStreamChunk + 16;

// The quantized activations' layout that the kernel reads (XqLayout): K chunk after K chunk, each
// holding every token's kStreamChunk bytes at kStreamXRow bytes apart (one copy per ring slot).
inline XqLayout stream_xq_layout(int64_t m) {
  XqLayout l;
  l.chunk = kStreamChunk;
  l.chunk_stride = m * kStreamXRow;
  l.row_stride = kStreamXRow;
  return l;
}
// Bytes of that layout for m tokens of k.
inline size_t stream_xq_bytes(int64_t m, int64_t k) {
  return static_cast<size_t>((k + kStreamChunk - 1) / kStreamChunk * m * kStreamXRow);
}

// Quantizing inside the kernel (StreamS8Args::fuse): up to kStreamFuseMaxM rows of 16-bit
// activations with m * k <= kStreamFuseMaxElems. Every block holds the raw rows and their
// quantized form in shared memory next to the ring, and quantizes them all before its first
// unit, with four helper warps beside the consumers. Measured on the H200 (bench --diagnose,
// M = 1, us, fused with three ring slots / the quantize kernel first): 6144 x 4096 15.1 / 16.3,
// 4096 x 4096 13.7 / 14.4, 28672 x 4096 36.3 / 37.7, 4096 x 14336 23.6 / 24.6, 8192 x 8192
// 25.3 / 26.2, 57344 x 8192 123.3 / 122.1 (two slots: 118.1), 8192 x 28672 66.8 / 66.9 (two
// slots: 65.6). Without the helper warps a row of 28672 took its blocks 5.4 us from the
// launch's start instead of 4.4, and the fused form lost on that layer (67.5 / 66.6).
inline constexpr int64_t kStreamFuseMaxM = 8;
inline constexpr int64_t kStreamFuseMaxElems = 32768;

// Device pointers and sizes of one launch. xq (stream_xq_layout), sa [m] and azp [m] (0 for
// symmetric schemes) are the quantize kernel's outputs; w [n, k] int8 row-major; sb [n]; azp_adj
// [n] (asymmetric schemes, as LayerWeights holds it); bias [n] fp32 or null (rounded to y's type in
// the kernel); y [m, n]; acc [m, n] optional (debug). counters [stream_s8_counters(n)] must be zero
// when the launch gets past its grid dependency (the quantize kernel zeroes them:
// launch_quantize_s8's `zero`); partials [stream_s8_partials_bytes(grid, m)] needs no initial
// value.
struct StreamS8Args {
  StreamTmaMap w_map;  // the weights' descriptor (stream_s8_weights_map of w)
  const int8_t* xq = nullptr;
  const float* sa = nullptr;
  const int32_t* azp = nullptr;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  QuantScheme scheme = QuantScheme::kDynamicSymmetric;
  const int8_t* w = nullptr;
  const float* sb = nullptr;
  const int32_t* azp_adj = nullptr;
  const float* bias = nullptr;
  void* y = nullptr;
  ElemType y_type = ElemType::kBF16;
  int32_t* acc = nullptr;
  int32_t* counters = nullptr;
  int32_t* partials = nullptr;
  // Blocks (one per SM at most: each holds a ring of nearly all of the SM's shared memory).
  int grid = 0;
  // Ring slots (0: the default, stream_s8.cu; at most what shared memory holds) and how many are
  // filled before the grid dependency (0: all, -1: none; a fused launch has no dependency and
  // fills them all at once).
  int stages = 0;
  int prefetch = 0;
  // Benchmarks only: block b takes the range of block (b + range_shift) % grid (every block must
  // be resident at once: an owner then may wait for a block dispatched after it).
  int range_shift = 0;
  // Benchmarks only: when set, every block writes kStreamTracePoints %globaltimer stamps (ns) at
  // trace[block * kStreamTracePoints + i]: entry, the producer past griddepcontrol.wait, the
  // first ring slot full (consumer warp 0), consumer warp 0 done (its last row block finished),
  // then (fused) the raw rows in shared memory and the rows quantized (consumer warp 0), the
  // block's SM id, and (fused) the rows' parameters known.
  uint64_t* trace = nullptr;
  // Launched as the previous kernel's programmatic dependent: the weights' first ring of copies
  // goes out before griddepcontrol.wait, everything that reads the previous kernel's results
  // after it.
  bool pdl = false;
  // Quantizing inside the kernel, with no quantize kernel before it (stream_s8_can_fuse): every
  // block copies x [m, k] (bf16 or fp16, 16-byte aligned) into its shared memory, gathers each
  // row's statistics and quantizes the rows there (qp, SPEC section 2, the quantize kernel's own
  // device code), while its producer streams the weights; xq, sa and azp are unused. Block 0
  // writes sa_out [m], azp_out [m] (asymmetric schemes, when not null) and xq_out
  // (stream_xq_layout, when not null) for the caller. The split row blocks meet through flags
  // [stream_s8_flags_bytes(grid)] instead of counters: a block stores `token` (nonzero) in its own
  // flag when its partial sums are out, and the owner waits for it and stores zero after reading
  // them. So the flags need no zeroing before a launch, only never to hold `token` when it
  // starts: a random 64-bit value per layer, which a completed launch leaves nowhere.
  bool fuse = false;
  const void* x = nullptr;
  ElemType x_type = ElemType::kBF16;
  QuantizeParams qp;
  float* sa_out = nullptr;
  int32_t* azp_out = nullptr;
  int8_t* xq_out = nullptr;
  uint64_t* flags = nullptr;
  uint64_t token = 0;
  // Units whose weights each block's producer prefetches into L2 at its start, past the ring
  // slots it fills first (fused: the whole ring; otherwise those filled before the grid
  // dependency), so that DRAM keeps streaming while the ring waits for the activations (fused:
  // their quantization; otherwise the grid dependency). 0: none.
  int l2_prefetch = 0;
};

inline constexpr int kStreamTracePoints = 8;

// The padded token count for m rows (m <= kStreamMaxM).
inline int stream_m_pad(int64_t m) { return m <= 8 ? 8 : m <= 16 ? 16 : 32; }

// How many int32 counters a layer of n rows needs (one per row block and consumer warp).
inline int64_t stream_s8_counters(int64_t n) {
  return (n + kStreamRows - 1) / kStreamRows * (kStreamRows / 16);
}

// Bytes of partial sums for `grid` blocks and m tokens: one row block per block (its tail, the
// part of a row block that a later block owns).
inline size_t stream_s8_partials_bytes(int grid, int64_t m) {
  return static_cast<size_t>(grid) * kStreamRows * stream_m_pad(m) * 4;
}

// Bytes of the flags of a fused launch on `grid` blocks (one per block and consumer warp).
inline size_t stream_s8_flags_bytes(int grid) {
  return static_cast<size_t>(grid) * (kStreamRows / 16) * sizeof(uint64_t);
}

// Whether m rows of k values are few and short enough to quantize inside the kernel, and whether
// a launch of them, of x_type at x, can.
inline bool stream_s8_fuses_rows(int64_t m, int64_t k) {
  return m >= 1 && m <= kStreamFuseMaxM && m * k <= kStreamFuseMaxElems;
}
inline bool stream_s8_fuses(int64_t m, int64_t k, ElemType x_type) {
  return stream_s8_fuses_rows(m, k) && (x_type == ElemType::kBF16 || x_type == ElemType::kF16);
}
inline bool stream_s8_can_fuse(int64_t m, int64_t k, ElemType x_type, const void* x) {
  return stream_s8_fuses(m, k, x_type) && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// Makes the TMA descriptor of n x k int8 weights at w (device memory, 16-byte aligned rows):
// boxes of box_rows rows (the kernel's: 64; the benchmark reads with others, up to 256) x 128
// bytes, 128-byte swizzle. With chunks > 1 (the benchmark's, k % 128 == 0) the descriptor is 3-D,
// (128 bytes of K, rows, 128-byte chunks of K), and one box is `chunks` such boxes side by side
// along K, chunk after chunk in shared memory. cudaErrorNotSupported without a driver that has
// cuTensorMapEncodeTiled.
cudaError_t stream_s8_weights_map(const int8_t* w, int64_t n, int64_t k, StreamTmaMap* map,
                                  int box_rows = kStreamRows, int chunks = 1);

// The grid for an n x k layer on the current device: one block per SM, fewer when the layer has
// fewer units. Sets the kernels' shared-memory limit on first use.
cudaError_t stream_s8_grid(int64_t n, int64_t k, int* grid);

// Enqueues the GEMM with exact int32 accumulation (mma.sync m16n8k32), the split row blocks
// reduced through `partials` by the last block to finish each, and the SPEC section 4 epilogue in
// its exact order. 1 <= m <= kStreamMaxM; k % 16 == 0, n % 16 == 0. Returns the launch error.
cudaError_t launch_stream_s8(const StreamS8Args& args, cudaStream_t stream);

}  // namespace qlinear::gpu
