// cuda.quantize: see quantize_s8.h. Every fp32 operation that the reference performs is written
// with an explicit round-to-nearest intrinsic (quantize_s8_device.cuh, shared with the fused
// kernels), so that neither FMA contraction nor approximate division can change a bit.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdint>

#include "kernels/cuda/cluster_launch.h"
#include "kernels/cuda/quantize_s8.h"
#include "kernels/cuda/quantize_s8_device.cuh"
#include "kernels/cuda/sm90_async_device.cuh"

namespace qlinear::gpu {
namespace {

constexpr int kMaxWarps = 32;

// Where a launch writes each row's sa and (azp not null, the row finite) azp: the caller's device
// buffers, and their mirrors in mapped pinned memory where given (RowParamsMirror).
struct RowOut {
  float* sa = nullptr;
  int32_t* azp = nullptr;
  float* sa_host = nullptr;
  int32_t* azp_host = nullptr;
  __device__ __forceinline__ void store(int64_t row, const device::RowParams& rp) const {
    sa[row] = rp.sa;
    if (sa_host != nullptr) sa_host[row] = rp.sa;
    if (rp.mode == device::kBadRow) return;
    if (azp != nullptr) azp[row] = rp.zp;
    if (azp_host != nullptr) azp_host[row] = rp.zp;
  }
};

using device::bits16_to_f32;
using device::kBadRow;
using device::kQuantize;
using device::quantize_value;
using device::to_f32;

// Where element e of a row goes in xq's layout `lay`. The plain layout (every row one chunk, as
// cuda.cutlass_sm90 and cuda.cublaslt take xq) takes no 64-bit division and remainder, which the
// kernels below made for every vector they store (up to 8 per thread in the 16-bit forms that take
// rows of up to 32768 values), the GEMM waiting for the kernel's end. Measured on an H100 (bench
// --weights_hint and --swap, the op as served, in turns, each binary run twice alternating, the
// fastest tile's best round, us, with the division -> without; at M = 1 and 16 also with
// quantize_rows_split_s8's slices in 32 bits): 8192 x 28672 at M = 64 86.8 -> 85.6, M = 128 94.8
// -> 93.8, M = 256 108.7 -> 107.0; 4096 x 14336 at M = 128 34.8 -> 34.1, M = 256 41.1 -> 40.1;
// 4096 x 4096 at M = 1 and 16 13.0 -> 12.7 and 13.1 -> 12.8; no layer or M slower by more than
// 0.2.
__device__ __forceinline__ int64_t xq_offset(int64_t e, const XqLayout& lay) {
  return e < lay.chunk ? e : (e / lay.chunk) * lay.chunk_stride + e % lay.chunk;
}

// Loads 4 consecutive elements starting at p (aligned to 4 elements) as fp32.
template <typename T>
__device__ __forceinline__ void load4(const T* p, float v[4]) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);  // 8 bytes: four 16-bit values
  v[0] = bits16_to_f32<T>(u.x & 0xffffu);
  v[1] = bits16_to_f32<T>(u.x >> 16);
  v[2] = bits16_to_f32<T>(u.y & 0xffffu);
  v[3] = bits16_to_f32<T>(u.y >> 16);
}
template <>
__device__ __forceinline__ void load4<float>(const float* p, float v[4]) {
  const float4 u = *reinterpret_cast<const float4*>(p);
  v[0] = u.x;
  v[1] = u.y;
  v[2] = u.z;
  v[3] = u.w;
}

// Loads 8 consecutive elements starting at p (aligned to 8 elements) as fp32: one 16-byte load
// for 16-bit types, two for fp32.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float v[8]) {
  device::widen8<T>(*reinterpret_cast<const uint4*>(p), *reinterpret_cast<float(*)[8]>(v));
}
template <>
__device__ __forceinline__ void load8<float>(const float* p, float v[8]) {
  load4(p, v);
  load4(p + 4, v + 4);
}

template <int W, typename T>
__device__ __forceinline__ void load_w(const T* p, float v[W]) {
  if constexpr (W == 8) {
    load8(p, v);
  } else if constexpr (W == 4) {
    load4(p, v);
  } else {
    v[0] = to_f32(*p);
  }
}

// Every quantize kernel's start: a kernel launched after it as its programmatic dependent
// (cuda.cutlass_sm90's GEMM, cuda.stream_s8) may start now, since it waits for this grid's
// completion before it reads xq, sa or azp, and its set-up overlaps this kernel; and the launch's
// zero[0, zero_count) is cleared, a grid-stride share per thread.
// Letting the dependent start later, once the rows' loads have arrived (so that they do not queue
// behind the weights the GEMM issues ahead of its wait) or once the rows' parameters are known,
// measured no faster on any benchmark layer at M = 1 and 16 (one block per row and the split-row
// form; the trigger's place a kernel argument in a build not kept, timed by bench --swap: the op
// as served with cuda.cutlass_sm90's fastest swapped tile, in turns, three rounds, us, trigger at
// the start / loads arrived / parameters known, and the GEMM alone):
//   6144 x 4096   M = 1  12.8-12.9 / 13.3-13.4 / 14.5-14.6 (12.4)
//                 M = 16 13.0-13.1 / 13.4-13.5 / 14.8-14.9 (12.3)
//   4096 x 4096   M = 1  11.1-11.3 / 11.1-11.3 / 12.4-12.5 (10.2)
//                 M = 16 11.0-11.3 / 11.2-11.4 / 12.5-12.6 (10.2)
//   28672 x 4096  M = 1  33.2-33.3 / 33.7-33.9 / 34.9-35.1 (33.1)
//                 M = 16 32.5-33.1 / 33.2-33.5 / 34.8-35.0 (34.2)
//   4096 x 14336  M = 1  20.8-21.0 / 21.2 / 22.0-22.3 (20.2)
//                 M = 16 20.8-21.0 / 20.9-21.2 / 21.9-22.1 (20.0)
//   8192 x 8192   M = 1  21.7-21.8 / 22.1-22.3 / 23.4-23.6 (21.9)
//                 M = 16 22.3-22.6 / 22.6 / 23.9-24.0 (21.7)
//   57344 x 8192  M = 1  108.8-108.9 / 109.2-109.5 / 110.7-110.9 (109.5)
//                 M = 16 109.9-110.0 / 110.4-110.5 / 111.7-111.9 (112.0)
//   8192 x 28672  M = 1  58.4-58.9 / 59.0-59.5 / 61.6-61.7 (58.3)
//                 M = 16 59.8-60.0 / 60.7-60.8 / 61.8-62.0 (58.6)
// Beside the same tile's GEMM alone (in brackets) the quantize kernel costs the op up to 1.4 us,
// and nothing on 57344 x 8192 and on 28672 x 4096 at M = 16.
__device__ __forceinline__ void start_quantize(int32_t* __restrict__ zero, int64_t zero_count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < zero_count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    zero[i] = 0;
  }
}

// W: elements per vector access (8, 4 or 1), as the alignment of x, xq and k allows.
template <typename T, QuantScheme S, int W>
__global__ void __launch_bounds__(1024)
    quantize_rows_s8(const T* __restrict__ x, int64_t k, QuantizeParams p, int8_t* __restrict__ xq,
                     RowOut out, int32_t* __restrict__ zero, int64_t zero_count, XqLayout lay) {
  constexpr bool kAbsmax = S == QuantScheme::kDynamicSymmetric;
  constexpr bool kMinMax = S == QuantScheme::kDynamicAsymmetric;
  const int64_t row = blockIdx.x;
  const T* xr = x + row * k;
  int8_t* qr = xq + row * lay.row_stride;
  start_quantize(zero, zero_count);
  // The row stays in registers between the passes, widened to fp32, when each thread holds at
  // most kCached vectors of it (k <= 32 * blockDim.x). (16-bit rows of whole 16-byte vectors take
  // quantize_rows_regs_s8 instead, up to k = 32768.)
  constexpr int kCached = 4;
  const bool cached = W == 8 && k <= static_cast<int64_t>(kCached) * W * blockDim.x;
  float cache[W == 8 ? kCached : 1][W];
  auto cached_vec = [&](int c, float(&v)[W]) {
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = cache[W == 8 ? c : 0][j];
  };
  // f(i, v) for each of this thread's cached vectors: element index i, values v.
  auto for_each_cached = [&](auto&& f) {
#pragma unroll
    for (int c = 0; c < (W == 8 ? kCached : 1); ++c) {
      const int64_t i = W * (static_cast<int64_t>(threadIdx.x) + c * blockDim.x);
      if (i < k) {
        float v[W];
        cached_vec(c, v);
        f(i, v);
      }
    }
  };

  // Pass 1: the row's reduction; the finiteness check rides on it.
  float absmax = 0.f, mn = INFINITY, mx = -INFINITY;
  bool bad = false;
  auto visit = [&](float v) {
    bad |= !(fabsf(v) <= FLT_MAX);
    if constexpr (kAbsmax) absmax = fmaxf(absmax, fabsf(v));
    if constexpr (kMinMax) {
      mn = fminf(mn, v);
      mx = fmaxf(mx, v);
    }
  };
  if (cached) {
    // Every load in flight at once, then the reduction from registers.
#pragma unroll
    for (int c = 0; c < (W == 8 ? kCached : 1); ++c) {
      const int64_t i = W * (static_cast<int64_t>(threadIdx.x) + c * blockDim.x);
      if (i < k) load_w<W>(xr + i, cache[W == 8 ? c : 0]);
    }
    for_each_cached([&](int64_t, const float(&v)[W]) {
#pragma unroll
      for (int j = 0; j < W; ++j) visit(v[j]);
    });
  } else {
    // Unrolled so that several loads are in flight per thread.
#pragma unroll 4
    for (int64_t i = W * static_cast<int64_t>(threadIdx.x); i < k; i += W * blockDim.x) {
      float v[W];
      load_w<W>(xr + i, v);
#pragma unroll
      for (int j = 0; j < W; ++j) visit(v[j]);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    if constexpr (kAbsmax) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, off));
    if constexpr (kMinMax) {
      mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, off));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    }
  }
  bad = __any_sync(0xffffffffu, bad);

  __shared__ float s_absmax[kMaxWarps], s_mn[kMaxWarps], s_mx[kMaxWarps];
  __shared__ int s_bad[kMaxWarps];
  __shared__ float s_mul, s_div;
  __shared__ int32_t s_zp;
  __shared__ int s_mode;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_absmax[warp] = absmax;
    s_mn[warp] = mn;
    s_mx[warp] = mx;
    s_bad[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int warps = blockDim.x / 32;
    for (int w = 1; w < warps; ++w) {
      absmax = fmaxf(absmax, s_absmax[w]);
      mn = fminf(mn, s_mn[w]);
      mx = fmaxf(mx, s_mx[w]);
      bad = bad || s_bad[w];
    }
    device::RowStats st;
    st.absmax = absmax;
    st.mn = mn;
    st.mx = mx;
    st.bad = bad;
    const device::RowParams rp = device::row_params<S>(st, p);
    out.store(row, rp);
    const int mode = rp.mode;
    const float mul = rp.mul, div = rp.div;
    const int32_t zp = rp.zp;
    s_mode = mode;
    s_mul = mul;
    s_div = div;
    s_zp = zp;
  }
  __syncthreads();
  const int mode = s_mode;
  if (mode == kBadRow) return;
  const float mul = s_mul, div = s_div;
  const int32_t zp = s_zp;

  // Pass 2: quantize (the row is in registers, or in L1/L2 from pass 1).
  auto emit = [&](int64_t e, const float(&v)[W]) {
    const int64_t i = xq_offset(e, lay);
    uint32_t packed[(W + 3) / 4] = {};
    if (mode == kQuantize) {
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const uint8_t q = static_cast<uint8_t>(quantize_value<S>(v[j], mul, div, zp));
        packed[j / 4] |= static_cast<uint32_t>(q) << (8 * (j % 4));
      }
    }
    if constexpr (W == 8) {
      *reinterpret_cast<uint2*>(qr + i) = make_uint2(packed[0], packed[1]);
    } else if constexpr (W == 4) {
      *reinterpret_cast<uint32_t*>(qr + i) = packed[0];
    } else {
      qr[i] = static_cast<int8_t>(packed[0]);
    }
  };
  if (cached) {
    for_each_cached(emit);
    return;
  }
#pragma unroll 4
  for (int64_t i = W * static_cast<int64_t>(threadIdx.x); i < k; i += W * blockDim.x) {
    float v[W] = {};
    if (mode == kQuantize) load_w<W>(xr + i, v);
    emit(i, v);
  }
}

// Many rows of 16-bit values (the prefill path): one warp per row, no block-wide synchronisation,
// each lane keeping kWarpLoads 16-byte loads in flight per step, the second pass reading the row
// again (from L2 when it is still there); the grid is capped at kWarpBlocksPerSm blocks per SM,
// each warp looping over rows; the statistics and the packing are the integer forms of
// quantize_s8_device.cuh (WarpRowStats, quantize8). Measured on the H200 (bf16 rows, dynamic
// symmetric, quantize kernel alone, us: one block per row / a warp per row with float statistics
// / this kernel, over three runs):
//   4096 x 4096   23.0 / 20.9 / 16.4-17.3     2048 x 8192    24.7 / 19.3 / 15.3-17.1
//   8192 x 8192  104.2 / 92.5 / 67-77         1024 x 14336   24.3 / 20.7 / 15.1-15.9
// Still short of the copy bandwidth (8192 x 8192 moves 192 MB: 45 us at 4.3 TB/s). Bringing each
// row into shared memory with one bulk copy instead (the row read from DRAM once) measured no
// faster: 21.9 us at 2048 x 8192, 67.1 at 8192 x 8192. Nor did holding each row in registers
// between the passes (a lane's share of the row loaded at once with evict-first loads, read from
// DRAM once), with one or two blocks per SM: 4096 x 4096 19.1-22.0 / 15.4-16.8, 2048 x 8192
// 20.5 / 21.8, 8192 x 8192 80.6 / 83.7 (this kernel 16.5-18.6, 16.1, 71.2 in the same run). Four
// blocks per SM made this kernel alone faster on rows of 4096 values (4096 x 4096 16.5-16.9 ->
// 14.3-14.8) but not the op it starts (the quantize kernel then the GEMM, 4096 x 4096 at M = 4096:
// 105.3-106.8 -> 106.9 us served), and slower on longer rows (8192 x 8192 71.2 -> 87.8).
constexpr int kRowsPerWarpBlock = 8;
constexpr int kWarpLoads = 8;
constexpr int kWarpBlocksPerSm = 2;

template <typename T, QuantScheme S>
__global__ void __launch_bounds__(32 * kRowsPerWarpBlock)
    quantize_rows_warp_s8(const T* __restrict__ x, int64_t m, int64_t k, QuantizeParams p,
                          int8_t* __restrict__ xq, RowOut out, int32_t* __restrict__ zero,
                          int64_t zero_count) {
  start_quantize(zero, zero_count);
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerWarpBlock + threadIdx.x / 32;
       row < m; row += static_cast<int64_t>(gridDim.x) * kRowsPerWarpBlock) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * k);
    const int64_t vecs = k / 8;
    device::WarpRowStats<T, S> ws;
    for (int64_t i0 = lane; i0 < vecs; i0 += 32 * kWarpLoads) {
      uint4 u[kWarpLoads] = {};
#pragma unroll
      for (int j = 0; j < kWarpLoads; ++j) {
        const int64_t i = i0 + 32 * j;
        if (i < vecs) u[j] = xr[i];
      }
#pragma unroll
      for (int j = 0; j < kWarpLoads; ++j) {
        if (i0 + 32 * j >= vecs) break;  // (a zero would move an asymmetric row's min or max)
        ws.visit8(u[j]);
      }
    }
    const device::RowParams rp = device::row_params<S>(ws.reduce(), p);
    if (lane == 0) {
      out.store(row, rp);
    }
    if (rp.mode == kBadRow) continue;
    uint2* qr = reinterpret_cast<uint2*>(xq + row * k);
    for (int64_t i0 = lane; i0 < vecs; i0 += 32 * kWarpLoads) {
      uint4 u[kWarpLoads] = {};
#pragma unroll
      for (int j = 0; j < kWarpLoads; ++j) {
        const int64_t i = i0 + 32 * j;
        if (i < vecs && rp.mode == kQuantize) u[j] = xr[i];
      }
#pragma unroll
      for (int j = 0; j < kWarpLoads; ++j) {
        const int64_t i = i0 + 32 * j;
        if (i >= vecs) break;
        qr[i] = rp.mode == kQuantize ? device::quantize8<T, S>(u[j], rp) : make_uint2(0, 0);
      }
    }
  }
}

// The block's statistics of its row (or slice of it) from each warp's own `st` (every lane
// holding its warp's), merged through `s_warp` (one entry per warp) by the first warp, each lane
// taking one warp's entry and the lanes meeting by shuffles; thread 0 gets the block's, the other
// threads of the first warp the same, the rest their warp's. Its barrier comes before the first
// warp reads s_warp: a caller that writes s_warp again needs another. (Thread 0 merging the warps
// one after another measured up to 1 us slower where blocks have 16 warps: docs/kernels.md,
// "Quantization inside the GEMM".)
__device__ __forceinline__ device::RowStats block_stats(const device::RowStats& st,
                                                        device::RowStats* s_warp) {
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = st;
  __syncthreads();
  if (threadIdx.x >= 32) return st;
  const device::RowStats none;  // merging it changes nothing
  return device::warp_reduce(threadIdx.x < blockDim.x / 32 ? s_warp[threadIdx.x] : none);
}

// The 8 values of a row at element e (a multiple of 8; a vector never straddles a chunk, chunk %
// 8 == 0), quantized with the row's parameters (zeros for a zero row), into the row's xq `qr` in
// layout `lay`.
template <typename T, QuantScheme S>
__device__ __forceinline__ void store_quantized8(int8_t* qr, int64_t e, const XqLayout& lay,
                                                 const uint4& v, const device::RowParams& rp) {
  *reinterpret_cast<uint2*>(qr + xq_offset(e, lay)) =
      rp.mode == kQuantize ? device::quantize8<T, S>(v, rp) : make_uint2(0, 0);
}

// A row's parameters from its block's warps' partial statistics (ws, every lane holding its
// warp's), merged through s_warp (one entry per warp): thread 0 works them out and writes the
// row's sa and azp, and every thread gets them through s_rp. Ends with the block's barrier.
template <typename T, QuantScheme S>
__device__ __forceinline__ device::RowParams block_row_params(device::WarpRowStats<T, S>& ws,
                                                              const QuantizeParams& p,
                                                              const RowOut& out, int64_t row,
                                                              device::RowStats* s_warp,
                                                              device::RowParams* s_rp) {
  const device::RowStats all = block_stats(ws.reduce(), s_warp);
  if (threadIdx.x == 0) {
    const device::RowParams rp = device::row_params<S>(all, p);
    out.store(row, rp);
    *s_rp = rp;
  }
  __syncthreads();
  return *s_rp;
}

// Rows of 16-bit values held in registers, one block per row, where the bulk, split and warp forms
// do not take the call (on any GPU; rows of up to 32768 values in whole 16-byte vectors): the
// integer statistics and packing of quantize_s8_device.cuh (WarpRowStats, quantize8, as those
// forms use) in place of quantize_rows_s8's per-value forms, which took these rows before. Where a
// call's rows all fit on the GPU at once (one wave of blocks) its time is mostly these
// instructions: at M = 256 on rows of 28672 values (14.7 MB, over the bulk form's kBulkMaxBytes; a
// read of 14.7 MB and a write of 7.3 MB) the per-value forms took 11.7 us on the H200, launch
// included (bench tile sweep, "quant"), this kernel 10.2 and 10.6 in two later runs.
constexpr int kRegsCached = 8;  // 16-byte vectors per thread: rows of up to 64 x blockDim.x values
template <typename T, QuantScheme S>
__global__ void __launch_bounds__(512, 2)
    quantize_rows_regs_s8(const T* __restrict__ x, int64_t k, QuantizeParams p,
                          int8_t* __restrict__ xq, RowOut out, int32_t* __restrict__ zero,
                          int64_t zero_count, XqLayout lay) {
  start_quantize(zero, zero_count);
  const int64_t row = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * k);
  const int64_t vecs = k / 8;
  uint4 raw[kRegsCached];
#pragma unroll
  for (int c = 0; c < kRegsCached; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i < vecs) raw[c] = xr[i];
  }
  device::WarpRowStats<T, S> ws;
#pragma unroll
  for (int c = 0; c < kRegsCached; ++c) {
    if (threadIdx.x + static_cast<int64_t>(c) * blockDim.x < vecs) ws.visit8(raw[c]);
  }
  __shared__ device::RowStats s_warp[kMaxWarps];
  __shared__ device::RowParams s_rp;
  const device::RowParams rp = block_row_params(ws, p, out, row, s_warp, &s_rp);
  if (rp.mode == kBadRow) return;
  int8_t* qr = xq + row * lay.row_stride;
#pragma unroll
  for (int c = 0; c < kRegsCached; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i < vecs) store_quantized8<T, S>(qr, 8 * i, lay, raw[c], rp);
  }
}

// A few long rows of 16-bit values (decode, M <= kSplitMaxM, K >= kSplitMinK): each row split
// among the blocks of a cluster, so that more SMs read and convert it. Each block takes a
// contiguous slice (every value in registers between the passes), the blocks' statistics meet
// through distributed shared memory, and each block writes its slice. Measured on the H200
// (bench tile sweep, the quantize kernel alone, us, one block per row -> split): K = 28672 at
// M = 1 7.6 -> 6.0, M = 16 7.9 -> 6.5; K = 14336 at M = 1 6.2 -> 5.7; cuda.stream_s8's op at
// M = 1 on 28672 x 4096 38.7 -> 37.3. Not for more rows: at M = 64 its blocks took the SMs that
// cuda.cutlass_sm90's early-launched GEMM would start on (4096 x 14336: 25.9 -> 28.7 us), and
// from M = 128 the quantize kernel alone got slower (K = 28672, M = 128: 8.5 -> 11.2 us).
constexpr int kSplitThreads = 128;
constexpr int kSplitCached = 4;  // 16-byte vectors per thread
constexpr int kSplitMaxBlocks = 8;

template <typename T, QuantScheme S>
__global__ void __launch_bounds__(kSplitThreads)
    quantize_rows_split_s8(const T* __restrict__ x, int64_t k, QuantizeParams p,
                           int8_t* __restrict__ xq, RowOut out, int32_t* __restrict__ zero,
                           int64_t zero_count, XqLayout lay) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  start_quantize(zero, zero_count);
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  // The slice in 32 bits, no 64-bit division ahead of the loads: split_blocks gives a row at most
  // kSplitMaxBlocks * kSplitThreads * kSplitCached vectors.
  static_assert(
      int64_t{kSplitMaxBlocks} * kSplitMaxBlocks * kSplitThreads * kSplitCached <= INT32_MAX,
      "vecs * (part + 1) fits in 32 bits");
  const unsigned parts = cluster.num_blocks(), part = cluster.block_rank();
  const int64_t row = blockIdx.x / parts;
  const unsigned vecs = static_cast<unsigned>(k / 8);
  const int64_t v0 = vecs * part / parts, v1 = vecs * (part + 1) / parts;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * k);
  uint4 raw[kSplitCached];
#pragma unroll
  for (int c = 0; c < kSplitCached; ++c) {
    const int64_t i = v0 + threadIdx.x + c * kSplitThreads;
    if (i < v1) raw[c] = xr[i];
  }
  device::WarpRowStats<T, S> ws;
#pragma unroll
  for (int c = 0; c < kSplitCached; ++c) {
    if (v0 + threadIdx.x + c * kSplitThreads < v1) ws.visit8(raw[c]);
  }
  __shared__ device::RowStats s_warp[kSplitThreads / 32];
  __shared__ device::RowStats s_block;
  __shared__ device::RowParams s_rp;
  const device::RowStats b = block_stats(ws.reduce(), s_warp);
  if (threadIdx.x == 0) s_block = b;
  cluster.sync();  // every block's statistics, visible to the cluster
  if (threadIdx.x == 0) {
    device::RowStats all;
    for (unsigned r = 0; r < parts; ++r) all.merge(*cluster.map_shared_rank(&s_block, r));
    const device::RowParams rp = device::row_params<S>(all, p);
    if (part == 0) {
      out.store(row, rp);
    }
    s_rp = rp;
  }
  cluster.sync();  // the parameters, for the block; no shared memory is read remotely after this
  const device::RowParams rp = s_rp;
  if (rp.mode == kBadRow) return;
  int8_t* qr = xq + row * lay.row_stride;
#pragma unroll
  for (int c = 0; c < kSplitCached; ++c) {
    const int64_t i = v0 + threadIdx.x + c * kSplitThreads;
    if (i < v1) store_quantized8<T, S>(qr, 8 * i, lay, raw[c], rp);
  }
#endif
}

// Long rows of 16-bit values for 17..256 tokens: one block per row, as quantize_rows_s8, but the
// row brought into shared memory by bulk copies that one thread issues at once, both passes
// reading it there. Measured on the H200 (bench tile sweep, this kernel alone, launch included,
// us, quantize_rows_s8 -> this kernel; one run, both binaries on one GPU):
//   K = 4096 (6144 x 4096)   M = 64 5.0 -> 4.6, M = 128 5.1 -> 4.5, M = 256 5.5 -> 4.9
//   K = 8192 (8192 x 8192)   M = 64 5.6 -> 5.3, M = 128 5.8 -> 5.5, M = 256 6.7 -> 6.2
//   K = 14336                M = 64 6.6 -> 6.2, M = 128 6.6 -> 6.6, M = 256 8.1 -> 7.7
//   K = 28672                M = 64 8.0 -> 7.6, M = 128 8.4 -> 8.0, M = 256 11.6 -> 12.4
// and the op it starts 0.2-1.2 us faster at M = 64-256 on every benchmark layer but 57344 x
// 8192 at M = 64 and 128 (within 0.1 us), e.g. 6144 x 4096 at M = 256 21.6 -> 20.4, 8192 x
// 28672 at M = 64 66.6 -> 65.5. With more than kBulkMaxBytes of rows (K = 28672 at M = 256) the
// copies of every resident block in flight at once made it slower, so those keep
// quantize_rows_s8. Measured and dropped (the op, us, one row per block -> the variant):
//   - 2 or 4 rows per block (fewer SMs quantizing, more left for the GEMM launched as the
//     dependent): slower on every layer, 4096 x 14336 at M = 64 25.1 -> 27.1 / 31.4, 8192 x 28672
//     at M = 64 67.2 -> 70.1 / 72.6, 8192 x 8192 at M = 128 29.0 -> 30.0 / 33.1;
//   - each row of 14336 values or more split among a cluster of 2 or 4 blocks up to M = 64 (the
//     statistics meeting through distributed shared memory, as quantize_rows_split_s8): the
//     kernel alone 1 us faster on 8192 x 28672 at M = 64 (8.6 -> 7.6 / 7.7), but the op no
//     faster there (69.3 -> 69.3 / 69.1) and slower on 4096 x 14336 (26.8 -> 31.4 / 29.2); that
//     cluster form with one block per row (a launch with a cluster attribute, cluster barriers)
//     was itself about 1 us slower than this kernel launched plainly (6144 x 4096 at M = 64, the
//     kernel alone 4.5-4.6 in two runs -> 5.7).
constexpr int kBulkPiece = 16384;  // bytes per bulk copy
constexpr int kBulkMaxThreads = 512;
template <typename T, QuantScheme S>
__global__ void __launch_bounds__(kBulkMaxThreads)
    quantize_rows_bulk_s8(const T* __restrict__ x, int64_t k, QuantizeParams p,
                          int8_t* __restrict__ xq, RowOut out, int32_t* __restrict__ zero,
                          int64_t zero_count, XqLayout lay) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char row_smem[];
  __shared__ __align__(8) uint64_t bar;
  start_quantize(zero, zero_count);
  const int64_t row = blockIdx.x;
  const uint32_t bytes = static_cast<uint32_t>(k * 2);
  const uint32_t b = device::smem_addr(&bar), dst = device::smem_addr(row_smem);
  if (threadIdx.x == 0) {
    device::mbar_init(b, 1);
    device::mbar_init_fence();
    device::mbar_expect_tx(b, bytes);
    const uint64_t policy = device::l2_evict_first();
    const unsigned char* src = reinterpret_cast<const unsigned char*>(x + row * k);
    for (uint32_t off = 0; off < bytes; off += kBulkPiece) {
      const uint32_t n = bytes - off < kBulkPiece ? bytes - off : kBulkPiece;
      device::bulk_copy(dst + off, src + off, n, b, policy);
    }
  }
  __syncthreads();  // the barrier initialised before anyone waits on it
  device::mbar_wait(b, 0);
  const uint4* r = reinterpret_cast<const uint4*>(row_smem);
  const int64_t vecs = k / 8;
  device::WarpRowStats<T, S> ws;
  for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) ws.visit8(r[i]);
  __shared__ device::RowStats s_warp[kBulkMaxThreads / 32];
  __shared__ device::RowParams s_rp;
  const device::RowParams rp = block_row_params(ws, p, out, row, s_warp, &s_rp);
  if (rp.mode == kBadRow) return;
  int8_t* qr = xq + row * lay.row_stride;
  for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
    store_quantized8<T, S>(qr, 8 * i, lay, r[i], rp);
  }
#endif
}

// Many rows of 16-bit values (M >= kWarpPerRowMinM) in the plain layout, each row read from DRAM
// once: one block per SM, each warp owning a ring of `slots` rows in shared memory, which its
// first lane fills with bulk copies `slots` rows ahead of the warp's work. The warp takes the
// row's statistics from the ring, then quantizes it from there (as quantize_rows_warp_s8 does,
// WarpRowStats and quantize8), and only then refills that slot, so that every SM keeps
// (slots - 1) x warps rows of loads in flight while it works. quantize_rows_warp_s8 reads each
// row twice, the second time from L2 only while the rows in flight fit there: at 8192 x 8192
// (192 MB moved) it ran at 1.7 TB/s on the H100, 113 us.
constexpr int kRingMaxWarps = 4;
constexpr int kRingMaxSlots = 4;
constexpr int kRingMinSlots = 2;
// Dynamic shared memory a ring may take: the SM's 227 KB per block less the static barriers.
constexpr int64_t kRingMaxBytes = 227 * 1024 - 8 * kRingMaxWarps * kRingMaxSlots;

template <typename T, QuantScheme S>
__global__ void __launch_bounds__(32 * kRingMaxWarps)
    quantize_rows_ring_s8(const T* __restrict__ x, int64_t m, int64_t k, int slots,
                          QuantizeParams p, int8_t* __restrict__ xq, RowOut out,
                          int32_t* __restrict__ zero, int64_t zero_count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char ring_smem[];
  __shared__ __align__(8) uint64_t bars[kRingMaxWarps * kRingMaxSlots];
  start_quantize(zero, zero_count);
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const uint32_t bytes = static_cast<uint32_t>(k * 2);
  const unsigned char* ring = ring_smem + static_cast<size_t>(warp) * slots * bytes;
  const uint32_t bar0 = device::smem_addr(&bars[warp * kRingMaxSlots]);
  const uint32_t dst0 = device::smem_addr(ring);
  uint64_t policy = 0;
  // Row r into slot s (first lane only).
  auto fill = [&](int s, int64_t r) {
    const uint32_t bar = bar0 + 8 * s, dst = dst0 + static_cast<uint32_t>(s) * bytes;
    device::mbar_expect_tx(bar, bytes);
    const unsigned char* src = reinterpret_cast<const unsigned char*>(x + r * k);
    for (uint32_t off = 0; off < bytes; off += kBulkPiece) {
      const uint32_t n = bytes - off < kBulkPiece ? bytes - off : kBulkPiece;
      device::bulk_copy(dst + off, src + off, n, bar, policy);
    }
  };
  int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  if (lane == 0) {
    policy = device::l2_evict_first();
    for (int s = 0; s < slots; ++s) device::mbar_init(bar0 + 8 * s, 1);
    device::mbar_init_fence();
    for (int s = 0; s < slots && row + s * warps < m; ++s) fill(s, row + s * warps);
  }
  __syncwarp();
  const int64_t vecs = k / 8;
  for (int64_t j = 0; row < m; ++j, row += warps) {
    const int s = static_cast<int>(j % slots);
    device::mbar_wait(bar0 + 8 * s, static_cast<uint32_t>(j / slots) & 1);
    const uint4* r = reinterpret_cast<const uint4*>(ring + static_cast<size_t>(s) * bytes);
    device::WarpRowStats<T, S> ws;
#pragma unroll 4
    for (int64_t i = lane; i < vecs; i += 32) ws.visit8(r[i]);
    const device::RowParams rp = device::row_params<S>(ws.reduce(), p);
    if (lane == 0) out.store(row, rp);
    if (rp.mode != kBadRow) {
      uint2* qr = reinterpret_cast<uint2*>(xq + row * k);
#pragma unroll 4
      for (int64_t i = lane; i < vecs; i += 32) {
        qr[i] = rp.mode == kQuantize ? device::quantize8<T, S>(r[i], rp) : make_uint2(0, 0);
      }
    }
    __syncwarp();  // every lane done with slot s before it is refilled
    const int64_t next = row + slots * warps;
    if (lane == 0 && next < m) {
      device::fence_proxy_async_shared();  // the lanes' reads of the slot before the copy's writes
      fill(s, next);
    }
  }
#endif
}

// Slots per warp of the ring for rows of k 16-bit values, on kRingMaxWarps warps; 0: the rows
// are too long for kRingMinSlots (k > 14520), or shorter than kRingMinK, whose second read the
// warp form finds in the L2 (2 blocks of 8 warps a row each, per SM, hold rows of 4096 values in
// 17 MB).
constexpr int64_t kRingMinK = 4096;
int ring_slots(int64_t k) {
  if (k < kRingMinK) return 0;
  const int64_t slots = std::min<int64_t>(kRingMaxSlots, kRingMaxBytes / (kRingMaxWarps * k * 2));
  return slots >= kRingMinSlots ? static_cast<int>(slots) : 0;
}

// Which rows take quantize_rows_bulk_s8: 16-bit, kBulkMinK..kBulkMaxK values (one row in shared
// memory), more than kSplitMaxM and at most kBulkMaxM of them (as measured), and at most
// kBulkMaxBytes of them in all.
constexpr int64_t kBulkMinK = 4096;
constexpr int64_t kBulkMaxK = 32768;
constexpr int64_t kBulkMaxM = 256;
constexpr int64_t kBulkMaxBytes = int64_t{8} << 20;

// How many blocks share one row of k 16-bit values in quantize_rows_split_s8 (1: the row is
// not split): enough for kSplitCached vectors per thread, a power of two.
// Splitting only rows of 14336 values or more measured no better (H200, bench, M = 16, us): the
// kernel alone within 0.3 us on the 4096- and 8192-value rows, the op 28672 x 4096 37.4 -> 38.7,
// 57344 x 8192 120.6 -> 122.3, others within 0.3 us.
constexpr int64_t kSplitMinK = 4096;
constexpr int64_t kSplitMaxM = 16;
int split_blocks(int64_t k) {
  if (k < kSplitMinK) return 1;
  const int64_t need = (k / 8 + kSplitThreads * kSplitCached - 1) / (kSplitThreads * kSplitCached);
  int64_t blocks = 2;
  while (blocks < need) blocks *= 2;
  return blocks <= kSplitMaxBlocks ? static_cast<int>(blocks) : 0;  // 0: too long to split
}

// set_quantize_ring_min_bytes's value; -1: the rule in launch_typed.
std::atomic<int64_t> g_ring_min_bytes{-1};

}  // namespace

void set_quantize_ring_min_bytes(int64_t bytes) { g_ring_min_bytes.store(bytes); }

int quantize_blocks_per_row(int64_t m, int64_t k) {
  if (m > kSplitMaxM) return 1;
  const int parts = split_blocks(k);
  return parts > 1 ? parts : 1;
}

namespace {

// An attribute of the current device, or `fallback` when it cannot be read.
int device_attribute(cudaDeviceAttr attr, int fallback) {
  int device = 0, v = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&v, attr, device) != cudaSuccess) {
    cudaGetLastError();
    return fallback;
  }
  return v;
}

// From this many rows on, 16-bit rows in the plain layout go to quantize_rows_warp_s8: enough
// for a block of 8 rows on most SMs (at 256 rows its 32 blocks left most SMs idle: the op at
// M = 256 on 8192 x 28672 went from 98.6 to 127.9 us).
constexpr int64_t kWarpPerRowMinM = 1024;

template <typename T, QuantScheme S>
cudaError_t launch_typed(const void* x, int64_t m, int64_t k, const QuantizeParams& p, int8_t* xq,
                         const RowOut& out, int32_t* zero, int64_t zero_count, const XqLayout& lay,
                         bool split, cudaStream_t stream) {
  // Enough threads that each handles a few vectors (four in flight at once); a block per row
  // keeps the row's reduction in one block (no second launch, no atomics), and small blocks let
  // many rows share an SM. Up to 1024 threads for rows of over 16384 values measured slower on
  // the H200 (bench tile sweep, this kernel alone, K = 28672, us): M = 64 8.0-8.2 -> 8.4,
  // M = 128 8.4-8.5 -> 8.8, M = 256 11.4-11.7 -> 15.9.
  int threads = 32;
  while (threads < 512 && threads * 32 < k) threads *= 2;
  auto aligned = [](const void* ptr, size_t bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
  };
  const T* xt = static_cast<const T*>(x);
  const dim3 grid(static_cast<unsigned>(m));
  // The SM keeps its shared memory configured at the maximum while this kernel runs: the GEMM
  // launched as its programmatic dependent needs nearly all of it, and an SM configured for this
  // kernel's few bytes would take the GEMM's block only after draining (measured: the block of
  // cuda.stream_s8 on the quantize kernel's SM started up to 8 us late). The same for the split
  // kernel (M <= 16): without it cuda.stream_s8's blocks at M = 16 started 2.2-3.6 us apart on
  // the H200 benchmark's layers, with it 0.2-0.6 us (bench --diagnose, "start spread"); the op
  // itself was no faster, its blocks waiting for this kernel's end before their first multiply.
  static const bool carveout_set = [] {
    for (const void* f : {reinterpret_cast<const void*>(quantize_rows_s8<T, S, 8>),
                          reinterpret_cast<const void*>(quantize_rows_s8<T, S, 4>),
                          reinterpret_cast<const void*>(quantize_rows_s8<T, S, 1>)}) {
      cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
    }
    if constexpr (sizeof(T) == 2) {
      cudaFuncSetAttribute(quantize_rows_split_s8<T, S>,
                           cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
      cudaFuncSetAttribute(quantize_rows_regs_s8<T, S>,
                           cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
    }
    cudaGetLastError();  // a hint: a device that refuses it runs the kernel all the same
    return true;
  }();
  (void)carveout_set;
  if constexpr (sizeof(T) == 2) {
    static const int major = device_attribute(cudaDevAttrComputeCapabilityMajor, 0);
    if (m >= kWarpPerRowMinM && lay.chunk == k && lay.row_stride == k && k % 8 == 0 &&
        aligned(x, 16) && aligned(xq, 8)) {
      static const int sms = device_attribute(cudaDevAttrMultiProcessorCount, 132);
      // (A device that refuses the shared-memory size keeps the warp form.)
      static const bool ring_ok = [] {
        const bool ok = cudaFuncSetAttribute(quantize_rows_ring_s8<T, S>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(kRingMaxBytes)) == cudaSuccess;
        cudaGetLastError();
        return ok;
      }();
      // Only on large x: below it the warp form's second read of a row finds it in L2, and the
      // warp form is faster. Where the ring starts to win, by row length (H100, 50 MB of L2,
      // bench --ring_switch, the kernel alone in turns, two runs, ring / warp):
      //   x (MB)          24    32    40    48    56    64    80    96   128   192
      //   K = 4096      1.43  1.04  0.95  0.99  1.03  1.08  1.03  0.99  0.93  0.86
      //   K = 8192      1.44  1.21  0.77  0.80  0.88  0.87  0.78  0.78  0.73  0.71
      //   K = 14336        -  1.23  0.77  0.76  0.74  0.72  0.79  0.75  0.71  0.71
      // (e.g. K = 8192 at 40 MB 35.1 -> 27.1 us, K = 14336 at 56 MB 53.3 -> 39.2; K = 4096 at
      // 128 MB 85.1 -> 79.6). So rows of 8192 values or more take the ring past three quarters of
      // the L2, shorter rows only past twice the L2.
      static const int64_t l2_bytes = device_attribute(cudaDevAttrL2CacheSize, 50 << 20);
      const int64_t ring_min_bytes = g_ring_min_bytes.load(std::memory_order_relaxed);
      const int64_t rule_bytes = k >= 8192 ? l2_bytes / 4 * 3 : 2 * l2_bytes;
      const int slots = ring_slots(k);
      if (major >= 9 && ring_ok && slots > 0 &&
          m * k * 2 > (ring_min_bytes < 0 ? rule_bytes : ring_min_bytes)) {
        const size_t smem = static_cast<size_t>(kRingMaxWarps) * slots * k * 2;
        const unsigned blocks =
            static_cast<unsigned>(std::min<int64_t>(sms, (m + kRingMaxWarps - 1) / kRingMaxWarps));
        quantize_rows_ring_s8<T, S><<<blocks, 32 * kRingMaxWarps, smem, stream>>>(
            xt, m, k, slots, p, xq, out, zero, zero_count);
        return cudaGetLastError();
      }
      const int64_t need = (m + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock;
      const unsigned blocks =
          static_cast<unsigned>(std::min<int64_t>(need, kWarpBlocksPerSm * sms));
      quantize_rows_warp_s8<T, S>
          <<<blocks, 32 * kRowsPerWarpBlock, 0, stream>>>(xt, m, k, p, xq, out, zero, zero_count);
      return cudaGetLastError();
    }
    // (A device that refuses the shared-memory size keeps the form below.)
    static const bool bulk_ok = [] {
      const bool ok = cudaFuncSetAttribute(quantize_rows_bulk_s8<T, S>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kBulkMaxK * 2)) == cudaSuccess;
      cudaFuncSetAttribute(quantize_rows_bulk_s8<T, S>,
                           cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
      cudaGetLastError();
      return ok;
    }();
    // What the 16-bit forms share: whole 16-byte vectors of x, 8-byte stores of xq; the bulk and
    // split forms also sm_90.
    const bool whole_vectors = k % 8 == 0 && lay.chunk % 8 == 0 && lay.row_stride % 8 == 0 &&
                               lay.chunk_stride % 8 == 0 && aligned(x, 16) && aligned(xq, 8);
    const bool vectors = whole_vectors && major >= 9;
    if (vectors && bulk_ok && m > kSplitMaxM && m <= kBulkMaxM && m * k * 2 <= kBulkMaxBytes &&
        k >= kBulkMinK && k <= kBulkMaxK) {
      const size_t smem = static_cast<size_t>(k) * 2;
      const unsigned bulk_threads = k >= 16384 ? kBulkMaxThreads : kBulkMaxThreads / 2;
      quantize_rows_bulk_s8<T, S>
          <<<grid, bulk_threads, smem, stream>>>(xt, k, p, xq, out, zero, zero_count, lay);
      return cudaGetLastError();
    }
    const int parts = split ? quantize_blocks_per_row(m, k) : 1;
    if (vectors && parts > 1) {
      const ClusterLaunch launch(static_cast<unsigned>(m * parts), kSplitThreads,
                                 static_cast<unsigned>(parts), 0, stream);
      return cudaLaunchKernelEx(&launch.config, quantize_rows_split_s8<T, S>, xt, k, p, xq, out,
                                zero, zero_count, lay);
    }
    if (whole_vectors && k <= static_cast<int64_t>(kRegsCached) * 8 * threads) {
      quantize_rows_regs_s8<T, S>
          <<<grid, threads, 0, stream>>>(xt, k, p, xq, out, zero, zero_count, lay);
      return cudaGetLastError();
    }
  }
  if (k % 8 == 0 && aligned(x, 8 * sizeof(T) < 16 ? 8 * sizeof(T) : 16) && aligned(xq, 8)) {
    quantize_rows_s8<T, S, 8>
        <<<grid, threads, 0, stream>>>(xt, k, p, xq, out, zero, zero_count, lay);
  } else if (k % 4 == 0 && aligned(x, 4 * sizeof(T)) && aligned(xq, 4)) {
    quantize_rows_s8<T, S, 4>
        <<<grid, threads, 0, stream>>>(xt, k, p, xq, out, zero, zero_count, lay);
  } else {
    quantize_rows_s8<T, S, 1>
        <<<grid, threads, 0, stream>>>(xt, k, p, xq, out, zero, zero_count, lay);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_for_type(const void* x, int64_t m, int64_t k, const QuantizeParams& p,
                            int8_t* xq, const RowOut& out, int32_t* zero, int64_t zero_count,
                            const XqLayout& lay, bool split, cudaStream_t stream) {
  switch (p.scheme) {
    case QuantScheme::kDynamicSymmetric:
      return launch_typed<T, QuantScheme::kDynamicSymmetric>(x, m, k, p, xq, out, zero, zero_count,
                                                             lay, split, stream);
    case QuantScheme::kStaticSymmetric:
      return launch_typed<T, QuantScheme::kStaticSymmetric>(x, m, k, p, xq, out, zero, zero_count,
                                                            lay, split, stream);
    case QuantScheme::kDynamicAsymmetric:
      return launch_typed<T, QuantScheme::kDynamicAsymmetric>(x, m, k, p, xq, out, zero, zero_count,
                                                              lay, split, stream);
    case QuantScheme::kStaticAsymmetric:
      return launch_typed<T, QuantScheme::kStaticAsymmetric>(x, m, k, p, xq, out, zero, zero_count,
                                                             lay, split, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

namespace {
__global__ void __launch_bounds__(256)
    zero_for_dependent(int32_t* __restrict__ zero, int64_t count) {
  start_quantize(zero, count);
}
}  // namespace

cudaError_t launch_zero_for_dependent(int32_t* zero, int64_t count, cudaStream_t stream) {
  if (zero == nullptr || count < 1) return cudaErrorInvalidValue;
  zero_for_dependent<<<1, 256, 0, stream>>>(zero, count);
  return cudaGetLastError();
}

cudaError_t launch_quantize_s8(const void* x, ElemType x_type, int64_t m, int64_t k,
                               const QuantizeParams& params, int8_t* xq, float* sa, int32_t* azp,
                               cudaStream_t stream, int32_t* zero, int64_t zero_count,
                               const XqLayout* layout, bool split, RowParamsMirror mirror) {
  if (m < 1 || m > 0x7fffffff || k < 1 || zero_count < 0) return cudaErrorInvalidValue;
  RowOut out;
  out.sa = sa;
  out.azp = azp;
  out.sa_host = mirror.sa;
  out.azp_host = azp != nullptr ? mirror.azp : nullptr;
  XqLayout lay;
  if (layout == nullptr || layout->chunk == 0) {
    lay.chunk = k;
    lay.row_stride = k;
  } else {
    if (layout->chunk % 8 != 0 || layout->chunk < 0) return cudaErrorInvalidValue;
    lay = *layout;
  }
  switch (x_type) {
    case ElemType::kF32:
      return launch_for_type<float>(x, m, k, params, xq, out, zero, zero_count, lay, split, stream);
    case ElemType::kF16:
      return launch_for_type<__half>(x, m, k, params, xq, out, zero, zero_count, lay, split,
                                     stream);
    case ElemType::kBF16:
      return launch_for_type<__nv_bfloat16>(x, m, k, params, xq, out, zero, zero_count, lay, split,
                                            stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace qlinear::gpu
