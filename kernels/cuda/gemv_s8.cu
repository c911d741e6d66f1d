// cuda.gemv_s8's device code: see gemv_s8.h for the design and gemv_s8_device.h for the contract.
//
// Layout of one block's work (256 threads = 8 warps):
//   warp w = wk * row_groups + wr streams rows [tile * 16 * row_groups + 16 * wr, +16) over its
//   K sub-slice, in 64-byte chunks: lane (g, t) = (lane / 4, lane % 4) loads 16 bytes of row g and
//   of row g + 8 at chunk byte 16 t. Those 16 bytes feed two mma.sync.m16n8k32 steps as the A
//   (weights, "wide") operand; the B operand (8 tokens x 32) comes from the quantized activations
//   in shared memory at the same 16 bytes of the token row g, so any permutation of k inside a
//   chunk is the same on both sides and the dot product is exact. The int32 accumulators of the
//   8 warps and of the split_k blocks of the cluster are summed (int32, exact in any order) by
//   whichever thread applies the epilogue to that output, reading its peers' shared memory
//   through distributed shared memory.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "kernels/cuda/cluster_launch.h"
#include "kernels/cuda/epilogue_s32_device.cuh"
#include "kernels/cuda/gemv_s8_device.h"
#include "kernels/cuda/l2_flush.h"
#include "kernels/cuda/quantize_s8_device.cuh"
#include "kernels/cuda/sm90_async_device.cuh"

namespace cg = cooperative_groups;

namespace qlinear::gpu {
namespace {

using device::RowParams;
using device::RowStats;
using device::warp_reduce;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Shared memory per block: two blocks must fit on an SM (228 KB, less 1 KB reserved per block).
constexpr int kMaxSmemBytes = 112 * 1024;
constexpr int kMaxSplitK = 8;  // the portable cluster size
constexpr int kXBatch = 8;     // activation loads in flight per lane in the statistics pass
constexpr int kOutBatch = 2;   // outputs per thread whose loads go out together in the epilogue

struct KernelParams {
  GemvS8Args a;
  int wr;        // row groups per tile (16 rows each)
  int wk;        // K sub-slices per block: kWarps / wr
  int s;         // split_k: blocks per cluster
  int c;         // clusters
  int tiles;     // ceil(n / (16 wr))
  int kc;        // 64-byte chunks in K (the last may be partial)
  int groups;    // load groups of U chunks per warp per tile (the same for every warp)
  int xstride;   // bytes per token row of the quantized slice in shared memory
  int xq_bytes;  // bytes of that slice, all m_pad rows
};

// Bytes of shared memory past the quantized slice: partial sums, row statistics, row parameters.
constexpr int extra_smem_bytes(int m_pad) {
  return kWarps * 16 * m_pad * 4 + static_cast<int>(sizeof(RowStats)) * kGemvMaxM +
         4 * 4 * kGemvMaxM + static_cast<int>(sizeof(RowParams)) * kGemvMaxM;
}

// 16 bytes of weights, read once: no L1 allocation, and a 256-byte L2 fetch since the warp's
// neighbouring lanes and its next chunk want the rest of the line.
__device__ __forceinline__ uint4 ldg_stream(const int8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// acc (16 x 8, int32) += A (16 x 32 s8, row) * B (32 x 8 s8, col).
__device__ __forceinline__ void mma_s8(int32_t (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Thread 0's stamp `point` of this block when the launch is traced (benchmarks).
__device__ __forceinline__ void trace_point(const GemvS8Args& a, int point) {
  if (a.trace != nullptr && threadIdx.x == 0) {
    a.trace[blockIdx.x * kGemvTracePoints + point] = device::globaltimer();
  }
}

__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Eight elements of x as raw bits (one 16-byte load for 16-bit types, two for fp32), cached in
// L1 for the quantization pass that reads them again. Volatile, like the weight loads, so that
// the compiler keeps the order in which they are issued.
struct Raw8 {
  uint4 lo, hi;
};
__device__ __forceinline__ uint4 ldg_ca(const void* p) {
  uint4 v;
  asm volatile("ld.global.ca.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ Raw8 load_raw8(const void* x, ElemType t, int64_t idx) {
  Raw8 r;
  if (t == ElemType::kF32) {
    const float* p = static_cast<const float*>(x) + idx;
    r.lo = ldg_ca(p);
    r.hi = ldg_ca(p + 4);
  } else {
    r.lo = ldg_ca(static_cast<const uint16_t*>(x) + idx);
    r.hi = make_uint4(0, 0, 0, 0);
  }
  return r;
}
__device__ __forceinline__ void widen8(const Raw8& r, ElemType t, float v[8]) {
  if (t == ElemType::kF32) {
    v[0] = __uint_as_float(r.lo.x), v[1] = __uint_as_float(r.lo.y);
    v[2] = __uint_as_float(r.lo.z), v[3] = __uint_as_float(r.lo.w);
    v[4] = __uint_as_float(r.hi.x), v[5] = __uint_as_float(r.hi.y);
    v[6] = __uint_as_float(r.hi.z), v[7] = __uint_as_float(r.hi.w);
    return;
  }
  const uint32_t w[4] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (t == ElemType::kBF16) {
      v[2 * i] = device::bits16_to_f32<__nv_bfloat16>(w[i] & 0xffffu);
      v[2 * i + 1] = device::bits16_to_f32<__nv_bfloat16>(w[i] >> 16);
    } else {
      v[2 * i] = device::bits16_to_f32<__half>(w[i] & 0xffffu);
      v[2 * i + 1] = device::bits16_to_f32<__half>(w[i] >> 16);
    }
  }
}

// Non-NaN floats as ints in the same order, for integer atomics (the reverse is from_ordered).
__device__ __forceinline__ int to_ordered(float f) {
  const int i = __float_as_int(f);
  return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float from_ordered(int i) {
  return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff);
}

// NG: 8-token mma n-blocks (m_pad = 8 NG). U: 64-byte chunks per load group; a warp keeps two
// groups in flight (2 x U x 2 x 16 bytes per lane).
template <int NG, int U>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_s8_kernel(const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kMpad = 8 * NG;
  extern __shared__ __align__(16) unsigned char smem[];
  int8_t* xq_s = reinterpret_cast<int8_t*>(smem);
  int32_t* part = reinterpret_cast<int32_t*>(smem + p.xq_bytes);  // [warp][16 rows][kMpad]
  RowStats* cstats = reinterpret_cast<RowStats*>(part + kWarps * 16 * kMpad);  // [m], cluster-read
  int* s_absmax = reinterpret_cast<int*>(cstats + kGemvMaxM);  // [m] this block's, ordered ints
  int* s_mn = s_absmax + kGemvMaxM;
  int* s_mx = s_mn + kGemvMaxM;
  int* s_bad = s_mx + kGemvMaxM;
  RowParams* rowp = reinterpret_cast<RowParams*>(s_bad + kGemvMaxM);  // [m]

  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int cid = static_cast<int>(blockIdx.x) / p.s;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int wr = warp % p.wr, wk = warp / p.wr;
  const GemvS8Args& a = p.a;
  const int64_t K = a.k, N = a.n;
  const int M = static_cast<int>(a.m);
  trace_point(a, 0);

  // This block's K slice and this warp's part of it, in 64-byte chunks.
  const int ck0 = rank * p.kc / p.s, ck1 = (rank + 1) * p.kc / p.s;
  const int wk0 = ck0 + wk * (ck1 - ck0) / p.wk, wk1 = ck0 + (wk + 1) * (ck1 - ck0) / p.wk;
  const int my_tiles = (p.tiles - cid + p.c - 1) / p.c;
  const int items = my_tiles * p.groups;  // (tile, load group) pairs, the same for the cluster

  uint4 buf_a[U][2], buf_b[U][2];
  int32_t acc[NG][4];
#pragma unroll
  for (int ng = 0; ng < NG; ++ng) acc[ng][0] = acc[ng][1] = acc[ng][2] = acc[ng][3] = 0;

  auto load_item = [&](int j, uint4(&buf)[U][2]) {
    const int ti = j / p.groups, g = j - ti * p.groups;
    const int64_t row = (static_cast<int64_t>(cid + ti * p.c) * p.wr + wr) * 16;
    const int8_t* r0 = a.w + (row + gq) * K;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cc = wk0 + g * U + u;
      const int64_t off = static_cast<int64_t>(cc) * 64 + 16 * tq;
      if (row < N && cc < wk1 && off < K) {
        buf[u][0] = ldg_stream(r0 + off);
        buf[u][1] = ldg_stream(r0 + 8 * K + off);
      } else {
        buf[u][0] = make_uint4(0, 0, 0, 0);
        buf[u][1] = make_uint4(0, 0, 0, 0);
      }
    }
  };

  auto compute_item = [&](int j, const uint4(&buf)[U][2]) {
    const int ti = j / p.groups, g = j - ti * p.groups;
    const int64_t row = (static_cast<int64_t>(cid + ti * p.c) * p.wr + wr) * 16;
    if (row >= N) return;  // warp-uniform
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cc = wk0 + g * U + u;
      if (cc < wk1) {  // warp-uniform
        const int xoff = (cc - ck0) * 64 + 16 * tq;
#pragma unroll
        for (int ng = 0; ng < NG; ++ng) {
          const uint4 b = *reinterpret_cast<const uint4*>(xq_s + (8 * ng + gq) * p.xstride + xoff);
          mma_s8(acc[ng], buf[u][0].x, buf[u][1].x, buf[u][0].y, buf[u][1].y, b.x, b.y);
          mma_s8(acc[ng], buf[u][0].z, buf[u][1].z, buf[u][0].w, buf[u][1].w, b.z, b.w);
        }
      }
    }
  };

  // After the last load group of a tile: publish this warp's partial sums, sum the cluster's
  // partials for this block's share of the tile's outputs, apply the epilogue, write y.
  auto finish_tile = [&](int j) {
    const int ti = j / p.groups;
    // The previous tile's readers are done with `part` (their arrive follows their reads).
    if (ti > 0) cluster_wait();
#pragma unroll
    for (int ng = 0; ng < NG; ++ng) {
      int32_t* r = part + (warp * 16 + gq) * kMpad + 8 * ng + 2 * tq;
      *reinterpret_cast<int2*>(r) = make_int2(acc[ng][0], acc[ng][1]);
      *reinterpret_cast<int2*>(r + 8 * kMpad) = make_int2(acc[ng][2], acc[ng][3]);
      acc[ng][0] = acc[ng][1] = acc[ng][2] = acc[ng][3] = 0;
    }
    cluster_arrive();
    cluster_wait();
    if (ti + 1 == my_tiles) trace_point(a, 4);
    const int rows = 16 * p.wr;
    const int64_t n0 = static_cast<int64_t>(cid + ti * p.c) * rows;
    const bool has_bias = a.bias != nullptr;
    const int total = rows * M, stride = p.s * kThreads;
    // Outputs in batches of kOutBatch per thread: every load of a batch (the channel's sb, bias and
    // azp_adj from global memory, the partial sums from each block's shared memory) is issued
    // before any is used, so a batch costs one round trip.
    for (int o0 = rank * kThreads + tid; o0 < total; o0 += kOutBatch * stride) {
      int64_t n[kOutBatch];
      int m[kOutBatch];
      bool ok[kOutBatch];
      float sb[kOutBatch], bias[kOutBatch];
      int32_t adj[kOutBatch];
      uint32_t sum[kOutBatch];
#pragma unroll
      for (int i = 0; i < kOutBatch; ++i) {
        const int o = o0 + i * stride;
        m[i] = o / rows;
        const int rr = o - m[i] * rows;
        n[i] = n0 + rr;
        ok[i] = o < total && n[i] < N;
        sb[i] = ok[i] ? a.sb[n[i]] : 0.f;
        bias[i] = ok[i] && has_bias ? a.bias[n[i]] : 0.f;
        adj[i] = ok[i] && a.azp_adj != nullptr ? a.azp_adj[n[i]] : 0;
        sum[i] = 0;  // int32 sums wrap the same in any order; the K limit keeps them exact
        const int at = ((rr >> 4) * 16 + (rr & 15)) * kMpad + m[i];  // row group rr/16, wk = 0
#pragma unroll
        for (int q = 0; q < kMaxSplitK; ++q) {
          if (ok[i] && q < p.s) {
            const int32_t* peer = cluster.map_shared_rank(part, q);
#pragma unroll
            for (int kk = 0; kk < kWarps; ++kk) {
              if (kk < p.wk) sum[i] += static_cast<uint32_t>(peer[at + kk * p.wr * 16 * kMpad]);
            }
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kOutBatch; ++i) {
        if (!ok[i]) continue;
        const int32_t total_acc = static_cast<int32_t>(sum[i]);
        const int64_t idx = static_cast<int64_t>(m[i]) * N + n[i];
        if (a.acc != nullptr) a.acc[idx] = total_acc;
        const RowParams& rp = rowp[m[i]];
        const float bias_f = has_bias ? device::round_to_y(a.y_type, bias[i]) : 0.f;
        device::store_y(a.y, a.y_type, idx,
                        device::dequant(a.quant.scheme, has_bias, total_acc, rp.sa, rp.zp, sb[i],
                                        adj[i], bias_f));
      }
    }
    cluster_arrive();
  };

  // --- Quantization of this block's K slice (SPEC section 2) ---
  // Pass 1: each row's statistics over the slice, rows spread over the block, then merged
  // across the cluster (max/min are exact in any order): every block gets the whole row's
  // absmax / min / max and the non-finite flag.
  const int64_t e0 = static_cast<int64_t>(ck0) * 64;
  const int64_t e1 = static_cast<int64_t>(ck1) * 64 < K ? static_cast<int64_t>(ck1) * 64 : K;
  if (tid < M) {
    s_absmax[tid] = 0;
    s_mn[tid] = to_ordered(INFINITY);
    s_mx[tid] = to_ordered(-INFINITY);
    s_bad[tid] = 0;
  }
  __syncthreads();
  // Work units of one row and 32 vectors of 16 bytes, one vector per lane; a warp takes units
  // warp, warp + 8, ... and reduces each with shuffles, then folds it into the row's statistics
  // with shared-memory atomics (max/min are exact in any order). Loads go out kXBatch units at a
  // time; the weights' first two load groups go out right behind the first batch, so that the
  // activations are not queued behind the weight stream in the memory system.
  const bool f32 = a.x_type == ElemType::kF32;
  const int per_vec = f32 ? 4 : 8;  // elements per 16-byte vector
  const int nvec = static_cast<int>((e1 - e0) / per_vec);
  const int cpr = (nvec + 31) / 32;
  const int units = M * cpr;
  bool weights_issued = false;
  for (int w0 = warp; w0 < units || !weights_issued; w0 += kXBatch * kWarps) {
    uint4 raw[kXBatch];
#pragma unroll
    for (int i = 0; i < kXBatch; ++i) {
      const int w = w0 + i * kWarps;
      const int m = w / cpr, v = (w - m * cpr) * 32 + lane;
      if (w < units && v < nvec) {
        raw[i] = ldg_ca(static_cast<const char*>(a.x) + (m * K + e0 + per_vec * v) * (f32 ? 4 : 2));
      }
    }
    if (!weights_issued) {
      load_item(0, buf_a);
      if (items > 1) load_item(1, buf_b);
      weights_issued = true;
    }
#pragma unroll
    for (int i = 0; i < kXBatch; ++i) {
      const int w = w0 + i * kWarps;
      if (w >= units) break;  // warp-uniform
      const int m = w / cpr, v = (w - m * cpr) * 32 + lane;
      RowStats st;
      if (v < nvec) {
        float f[8];
        Raw8 r;
        r.lo = raw[i];
        r.hi = make_uint4(0, 0, 0, 0);
        widen8(r, a.x_type, f);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (j < per_vec) st.visit(f[j]);
        }
      }
      st = warp_reduce(st);
      if (lane == 0) {
        atomicMax(s_absmax + m, __float_as_int(st.absmax));  // >= 0: int order is float order
        atomicMin(s_mn + m, to_ordered(st.mn));
        atomicMax(s_mx + m, to_ordered(st.mx));
        if (st.bad) atomicOr(s_bad + m, 1);
      }
    }
  }
  __syncthreads();
  trace_point(a, 1);
  if (tid < M) {
    RowStats st;
    st.absmax = __int_as_float(s_absmax[tid]);
    st.mn = from_ordered(s_mn[tid]);
    st.mx = from_ordered(s_mx[tid]);
    st.bad = s_bad[tid] != 0;
    cstats[tid] = st;
  }
  cluster_arrive();
  cluster_wait();
  if (tid < M) {
    RowStats st = cstats[tid];
    for (int q = 0; q < p.s; ++q) {
      if (q != rank) st.merge(*cluster.map_shared_rank(cstats + tid, q));
    }
    const RowParams rp = device::row_params(a.quant.scheme, st, a.quant);
    rowp[tid] = rp;
    if (cid == 0 && rank == 0) {
      a.sa[tid] = rp.sa;
      if (a.azp != nullptr) a.azp[tid] = rp.zp;
    }
  }
  __syncthreads();
  trace_point(a, 2);
  // Pass 2: quantize the slice into shared memory (x again, now from L1/L2); padding tokens,
  // bytes past K, bad and constant rows are zeros.
  const int row_units = (ck1 - ck0) * 8;  // 8-byte units per token row
#pragma unroll 4
  for (int u = tid; u < kMpad * row_units; u += kThreads) {
    const int m = u / row_units;
    const int64_t e = e0 + static_cast<int64_t>(u - m * row_units) * 8;
    uint32_t lo = 0, hi = 0;
    if (m < M && e < K) {
      const RowParams rp = rowp[m];
      if (rp.mode == device::kQuantize) {
        float v[8];
        widen8(load_raw8(a.x, a.x_type, static_cast<int64_t>(m) * K + e), a.x_type, v);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          lo |= static_cast<uint32_t>(
                    static_cast<uint8_t>(device::quantize_value(a.quant.scheme, v[i], rp)))
                << (8 * i);
          hi |= static_cast<uint32_t>(
                    static_cast<uint8_t>(device::quantize_value(a.quant.scheme, v[4 + i], rp)))
                << (8 * i);
        }
      }
      if (a.xq != nullptr && cid == 0) {
        *reinterpret_cast<uint2*>(a.xq + static_cast<int64_t>(m) * K + e) = make_uint2(lo, hi);
      }
    }
    *reinterpret_cast<uint2*>(xq_s + m * p.xstride + (e - e0)) = make_uint2(lo, hi);
  }
  __syncthreads();
  trace_point(a, 3);

  // --- Weight streaming: two load groups in flight while the previous one is multiplied ---
  for (int j = 0; j < items; j += 2) {
    compute_item(j, buf_a);
    if (j + 2 < items) load_item(j + 2, buf_a);
    if ((j + 1) % p.groups == 0) finish_tile(j);
    if (j + 1 >= items) break;
    compute_item(j + 1, buf_b);
    if (j + 3 < items) load_item(j + 3, buf_b);
    if ((j + 2) % p.groups == 0) finish_tile(j + 1);
  }
  // Peers may still read this block's partial sums until they arrive.
  cluster_wait();
  trace_point(a, 5);
#endif
}

// 64-byte chunks per load group a plan may use at an m_pad: two groups of U x 32 bytes are in
// flight per lane, two blocks per SM, so U = 4 is 128 KB per SM in registers and U = 2 half of
// that. From m_pad = 32 on the accumulators need the registers, and only U = 2 is built.
bool chunks_allowed(int m_pad, int chunks) { return chunks == 2 || (chunks == 4 && m_pad <= 16); }

// Calls f(kernel) with the instantiation for (m_pad, chunks); cudaErrorInvalidValue if none.
template <typename F>
cudaError_t with_kernel(int m_pad, int chunks, F&& f) {
  switch (m_pad * 8 + chunks) {
    case 8 * 8 + 2:
      return f(gemv_s8_kernel<1, 2>);
    case 8 * 8 + 4:
      return f(gemv_s8_kernel<1, 4>);
    case 16 * 8 + 2:
      return f(gemv_s8_kernel<2, 2>);
    case 16 * 8 + 4:
      return f(gemv_s8_kernel<2, 4>);
    case 32 * 8 + 2:
      return f(gemv_s8_kernel<4, 2>);
    case 64 * 8 + 2:
      return f(gemv_s8_kernel<8, 2>);
  }
  return cudaErrorInvalidValue;
}

// Raises each instantiation's dynamic shared memory limit once.
cudaError_t allow_smem_for(int m_pad, int chunks) {
  static std::once_flag once;
  static cudaError_t result = cudaSuccess;
  std::call_once(once, [] {
    for (int mp : {8, 16, 32, 64}) {
      for (int u : {2, 4}) {
        if (!chunks_allowed(mp, u)) continue;
        const cudaError_t e = with_kernel(mp, u, [](auto kernel) {
          return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      kMaxSmemBytes);
        });
        if (e != cudaSuccess && result == cudaSuccess) result = e;
      }
    }
  });
  if (!chunks_allowed(m_pad, chunks)) return cudaErrorInvalidValue;
  return result;
}

cudaError_t max_active_clusters_for(int m_pad, int chunks, int split_k, int smem, int* out) {
  const ClusterLaunch launch(static_cast<unsigned>(split_k * 1024), kThreads,
                             static_cast<unsigned>(split_k), static_cast<size_t>(smem), nullptr);
  return with_kernel(m_pad, chunks, [&](auto kernel) {
    return cudaOccupancyMaxActiveClusters(out, kernel, &launch.config);
  });
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Shape-only half of a plan: K slice sizes and shared memory. False when it cannot run.
bool split_fits(int64_t k, int m_pad, int row_groups, int split_k, int* xstride, int* smem) {
  const int64_t kc = ceil_div(k, 64);
  const int wk = kWarps / row_groups;
  if (split_k < 1 || split_k > kMaxSplitK || kc < static_cast<int64_t>(split_k) * wk) return false;
  const int64_t slice = ceil_div(kc, split_k) * 64;
  // Token rows 64 bytes apart modulo 128 keep the 16-byte B-operand loads free of bank conflicts.
  const int64_t stride = slice % 128 == 0 ? slice + 64 : slice;
  const int64_t bytes = m_pad * stride + extra_smem_bytes(m_pad);
  if (bytes > kMaxSmemBytes) return false;
  *xstride = static_cast<int>(stride);
  *smem = static_cast<int>(bytes);
  return true;
}

// Cost model constants (H200, checked against the plan sweep of bench/gpu/gpu_bench.cc): HBM
// read bandwidth the kernel can reach, L2 bandwidth for the activation re-reads, and the
// latency-bound steps: each round of tiles (cluster barriers), each epilogue batch, each
// statistics batch after the first, each quantization batch, and the launch.
constexpr double kHbmBytesPerUs = 4.0e6;
constexpr double kL2BytesPerUs = 8.0e6;
constexpr double kTileUs = 0.5;
constexpr double kOutBatchUs = 0.5;
constexpr double kStatBatchUs = 2.0;
constexpr double kQuantBatchUs = 0.3;
constexpr double kLaunchUs = 4.0;

}  // namespace

bool gemv_s8_fits(int64_t k, int m_pad) {
  int xstride = 0, smem = 0;
  for (int split_k = 1; split_k <= kMaxSplitK; ++split_k) {
    if (split_fits(k, m_pad, kWarps, split_k, &xstride, &smem)) return true;
  }
  return false;
}

cudaError_t plan_gemv_s8_fixed(int64_t n, int64_t k, int m_pad, int x_elem_bytes, int row_groups,
                               int split_k, GemvS8Plan* plan, int chunks) {
  if (n < 16 || n % 16 != 0 || k < 16 || k % 16 != 0) return cudaErrorNotSupported;
  if (row_groups != 1 && row_groups != 2 && row_groups != 4 && row_groups != 8) {
    return cudaErrorNotSupported;
  }
  int xstride = 0, smem = 0;
  if (!split_fits(k, m_pad, row_groups, split_k, &xstride, &smem)) return cudaErrorNotSupported;
  if (chunks == 0) chunks = m_pad <= 16 ? 4 : 2;
  if (!chunks_allowed(m_pad, chunks)) return cudaErrorNotSupported;
  cudaError_t e = allow_smem_for(m_pad, chunks);
  if (e != cudaSuccess) return e;
  int max_clusters = 0;
  e = max_active_clusters_for(m_pad, chunks, split_k, smem, &max_clusters);
  if (e != cudaSuccess) return e;
  if (max_clusters < 1) return cudaErrorNotSupported;
  int device = 0, sms = 0;
  if ((e = cudaGetDevice(&device)) != cudaSuccess) return e;
  if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) {
    return e;
  }
  const int64_t rows = 16 * row_groups;
  const int64_t tiles = ceil_div(n, rows);
  const int64_t clusters = std::min<int64_t>(tiles, max_clusters);
  const int64_t rounds = ceil_div(tiles, clusters);
  // Blocks stream at an equal rate, so the busiest cluster's rounds set the time; fewer than
  // about 1.5 blocks per SM leave bandwidth unused.
  const double blocks = static_cast<double>(clusters * split_k);
  const double saturation = std::min(1.0, blocks / (1.5 * sms));
  const double weight_bytes =
      static_cast<double>(rounds * rows * clusters) * static_cast<double>(k);
  const double x_bytes =
      static_cast<double>(clusters) * m_pad * static_cast<double>(k) * x_elem_bytes;
  // Latency-bound parts: statistics batches after the first (queued behind the weights), the
  // quantization pass, and each round's epilogue batches.
  const int64_t slice_vectors = ceil_div(ceil_div(k, 64), split_k) * 8;
  const int64_t stat_batches = ceil_div(m_pad * ceil_div(slice_vectors, 32), kWarps * kXBatch);
  const int64_t quant_batches = ceil_div(m_pad * slice_vectors, kThreads * 4);
  const int64_t out_batches =
      ceil_div(rows * m_pad, static_cast<int64_t>(split_k) * kThreads * kOutBatch);
  plan->row_groups = row_groups;
  plan->split_k = split_k;
  plan->clusters = static_cast<int>(clusters);
  plan->m_pad = m_pad;
  plan->smem_bytes = smem;
  plan->chunks = chunks;
  plan->predicted_us = weight_bytes / (kHbmBytesPerUs * saturation) + x_bytes / kL2BytesPerUs +
                       static_cast<double>(stat_batches - 1) * kStatBatchUs +
                       static_cast<double>(quant_batches) * kQuantBatchUs +
                       static_cast<double>(rounds) * (kTileUs + out_batches * kOutBatchUs) +
                       kLaunchUs;
  return cudaSuccess;
}

cudaError_t plan_gemv_s8(int64_t n, int64_t k, int m_pad, int x_elem_bytes, GemvS8Plan* plan) {
  bool found = false;
  for (int row_groups : {8, 4, 2, 1}) {
    for (int split_k = 1; split_k <= kMaxSplitK; ++split_k) {
      GemvS8Plan p;
      const cudaError_t e = plan_gemv_s8_fixed(n, k, m_pad, x_elem_bytes, row_groups, split_k, &p);
      if (e == cudaErrorNotSupported) continue;
      if (e != cudaSuccess) return e;
      // Ties go to the plan found first: larger tiles, fewer blocks per cluster.
      if (!found || p.predicted_us < plan->predicted_us - 1e-9) *plan = p;
      found = true;
    }
  }
  return found ? cudaSuccess : cudaErrorNotSupported;
}

cudaError_t tune_gemv_s8(const GemvS8Args& args, int m_pad, void* flush, size_t flush_bytes,
                         int candidates, cudaStream_t stream, GemvS8Plan* plan) {
  std::vector<GemvS8Plan> plans;
  for (int row_groups : {8, 4, 2, 1}) {
    for (int split_k = 1; split_k <= kMaxSplitK; ++split_k) {
      GemvS8Plan p;
      for (int chunks : {4, 2}) {
        const cudaError_t e =
            plan_gemv_s8_fixed(args.n, args.k, m_pad, 2, row_groups, split_k, &p, chunks);
        if (e == cudaErrorNotSupported) continue;
        if (e != cudaSuccess) return e;
        plans.push_back(p);
      }
    }
  }
  if (plans.empty()) return cudaErrorNotSupported;
  std::stable_sort(plans.begin(), plans.end(), [](const GemvS8Plan& x, const GemvS8Plan& y) {
    return x.predicted_us < y.predicted_us;
  });
  plans.resize(std::min<size_t>(plans.size(), static_cast<size_t>(std::max(candidates, 1))));
  cudaEvent_t ev[2] = {nullptr, nullptr};
  cudaError_t e = cudaEventCreate(&ev[0]);
  if (e == cudaSuccess) e = cudaEventCreate(&ev[1]);
  float best_ms = 0.f;
  int best = -1;
  constexpr int kReps = 5;
  // The flush's sink: the buffer's own first word (a scratch buffer; written all but never).
  uint32_t* sink = static_cast<uint32_t*>(flush);
  for (size_t i = 0; i < plans.size() && e == cudaSuccess; ++i) {
    float ms[kReps] = {};
    for (int rep = 0; rep < kReps && e == cudaSuccess; ++rep) {
      // A cold L2, as a served model's layer sees it (its weights were read a layer ago). The
      // flush only reads: written lines would be written back while the timed launch runs.
      if (flush != nullptr) e = launch_l2_flush_read(flush, flush_bytes, sink, stream);
      if (e == cudaSuccess) e = cudaEventRecord(ev[0], stream);
      if (e == cudaSuccess) e = launch_gemv_s8(args, plans[i], stream);
      if (e == cudaSuccess) e = cudaEventRecord(ev[1], stream);
      if (e == cudaSuccess) e = cudaEventSynchronize(ev[1]);
      if (e == cudaSuccess) e = cudaEventElapsedTime(&ms[rep], ev[0], ev[1]);
    }
    std::sort(ms, ms + kReps);
    const float plan_ms = ms[kReps / 2];
    if (e == cudaSuccess && (best < 0 || plan_ms < best_ms)) {
      best = static_cast<int>(i);
      best_ms = plan_ms;
    }
  }
  for (cudaEvent_t x : ev) {
    if (x != nullptr) cudaEventDestroy(x);
  }
  if (e != cudaSuccess) return e;
  *plan = plans[best];
  plan->measured_us = 1e3 * best_ms;
  return cudaSuccess;
}

cudaError_t launch_gemv_s8(const GemvS8Args& args, const GemvS8Plan& plan, cudaStream_t stream) {
  if (args.m < 1 || args.m > plan.m_pad || args.n % 16 != 0 || args.k % 16 != 0 ||
      args.x == nullptr || args.w == nullptr || args.sb == nullptr || args.y == nullptr ||
      args.sa == nullptr || reinterpret_cast<uintptr_t>(args.x) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const bool asym = args.quant.scheme == QuantScheme::kDynamicAsymmetric ||
                    args.quant.scheme == QuantScheme::kStaticAsymmetric;
  if (asym && args.azp_adj == nullptr) return cudaErrorInvalidValue;
  KernelParams kp;
  kp.a = args;
  kp.wr = plan.row_groups;
  kp.wk = kWarps / plan.row_groups;
  kp.s = plan.split_k;
  kp.c = plan.clusters;
  kp.tiles = static_cast<int>(ceil_div(args.n, 16 * plan.row_groups));
  kp.kc = static_cast<int>(ceil_div(args.k, 64));
  int smem = 0;
  if (!split_fits(args.k, plan.m_pad, plan.row_groups, plan.split_k, &kp.xstride, &smem) ||
      smem != plan.smem_bytes || plan.clusters < 1 || plan.clusters > kp.tiles) {
    return cudaErrorInvalidValue;
  }
  kp.xq_bytes = plan.m_pad * kp.xstride;
  const int max_warp_chunks = static_cast<int>(ceil_div(ceil_div(kp.kc, kp.s), kp.wk));

  const ClusterLaunch launch(static_cast<unsigned>(plan.clusters * plan.split_k), kThreads,
                             static_cast<unsigned>(plan.split_k),
                             static_cast<size_t>(plan.smem_bytes), stream);
  cudaError_t e = allow_smem_for(plan.m_pad, plan.chunks);
  if (e != cudaSuccess) return e;
  kp.groups = static_cast<int>(ceil_div(max_warp_chunks, plan.chunks));
  return with_kernel(plan.m_pad, plan.chunks,
                     [&](auto kernel) { return cudaLaunchKernelEx(&launch.config, kernel, kp); });
}

}  // namespace qlinear::gpu
