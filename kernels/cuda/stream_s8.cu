// cuda.stream_s8's device code: see stream_s8.h for the design and stream_s8_device.h for the
// contract.
//
// One block per SM, 5 warps: warp 4 is the producer, warps 0-3 the consumers. The layer's work
// units (kStreamRows rows x kStreamChunk bytes of K, row block after row block, K fastest) are cut
// into `grid` contiguous ranges of equal length, one per block, so every SM streams the same
// number of weight bytes whatever the shape. A row block split between neighbouring blocks is
// summed by its owner, the block holding its last unit, each consumer warp for its own 16 rows.
// A block takes its range in the order that keeps the summing off the end of the kernel: first
// its tail, the part of a row block that a later block owns (it stores its partial sums and
// publishes them with a release increment), then the row blocks it holds whole, then its head,
// the part of the row block it owns that began in earlier blocks (it adds their partial sums,
// long published by then, and writes y). The kernel's last work on every SM is then a plain
// epilogue: no atomic round trip at the end, and no block waits for another that is still
// streaming. An owner only ever waits for lower-indexed blocks, which the hardware dispatches
// before it, and each of those publishes before it waits for anything but its own loads.
// Measured on the H200 (bench --diagnose, the op at M = 1, us), against the plain order with the
// last block to finish a row block summing it (an acq_rel round trip at every block's end):
// 4096 x 4096 16.5 -> 14.2, 6144 x 4096 18.5 -> 17.0, 28672 x 4096 40.7 -> 38.6, 4096 x 14336
// 26.4 -> 24.8, 8192 x 8192 27.2 -> 26.7, 57344 x 8192 122.2 -> 121.4, 8192 x 28672 68.4 -> 67.4.
// The blocks still finish 4-11 us apart: SMs stream at different rates. Ranges claimed from a
// counter as blocks finish (a fifth of the units in small ranges) measured slower on every shape
// (28672 x 4096: 52 us), the claimed ranges' units arriving at a third of the static ones' rate.
// So did more blocks than SMs (2-4 times the grid, rings of 2 slots so that two blocks share an SM
// where their shared memory allows), which let the blocks of later waves start on whichever SM
// frees first: at M = 1, us, served / 2x / 4x the grid (quantize kernel first; fused): 4096 x
// 4096 13.3 / 17.6 / 21.9; 18.6 / 26.4, 8192 x 28672 66.5 / 70.0 / 76.3; 72.5 / 84.4, 57344 x
// 8192 123.3 / 124.0 / 131.2; 122.9 / 132.2. Each block's start (its ring's first loads, and
// fused its own quantization of the rows) costs more than the balance gains.
// Which ranges end last (bench --diagnose, "latest ranges", and stamps of an experiment build):
// on 4096 x 4096 at M = 1, those of one tail unit and three head units, 3 us after the median
// block. Their last unit arrived 1.5-2 us after their neighbours' (they publish after their first
// unit, and a release store waits until the warp's stores are out), their wait for the earlier
// blocks' partial sums ended about 1 us after that, and the epilogue, loading the per-channel
// values only then, took another 1.4 us.
// Measured and dropped (H200, the op, us): announcing the partial sums one unit later (the
// release after the warp's next unit; this kernel against that build in turns, three rounds):
// 4096 x 4096 at M = 1 13.5-13.6 -> 12.7-13.0 and at M = 16 16.0-16.2 -> 15.5-15.6, but every
// other layer 0.2-0.7 us slower (28672 x 4096 M = 1 36.1-36.3 -> 36.8-36.9, 57344 x 8192
// 122.4-122.5 -> 123.0-123.2, 8192 x 28672 66.2-66.4 -> 66.7-67.2). In a build with switches
// (itself 0.5-1.9 us slower than this kernel on five of the seven layers with all of them off):
// loading the per-channel values at each row block's first unit, 28672 x 4096 at M = 1 38.3 ->
// 36.7-36.9 but 57344 x 8192 118.8-118.9 -> 121.6; polling the earlier blocks' flags together, no
// change.
// Which blocks are late follows the SM more than the range (bench --diagnose, ranges shifted by
// half the grid on alternate launches: the correlation of a block's lateness between the two
// halves is 0.79-0.90 per SM and -0.01-0.60 per range on the layers with K = 8192 and 28672), but
// not steadily enough to size the ranges by it: shares sized to each block's measured speed
// made the op 0.8-4.4 us slower at M = 1 and 16 on every benchmark layer but one (57344 x 8192
// at M = 1: 1.3 us faster).
// The order itself costs little: the weights read alone in it (bench --diagnose,
// "diagnose-read": plain 16-byte loads, units of 64 or 16 rows x 32 KB, one range per SM, 2-4
// units in flight) took 3-10% longer than a plain read stream of the same bytes, whatever the
// rows per unit and the depth, us, plain / this order: 28672 x 4096 30.1 / 31.8-33.0, 8192 x 28672
// 58.0 / 60.4-61.2, 57344 x 8192 109.6 / 112.7-113.8. The op at M = 1 took 4-7 us more than that
// (36.6-37.3, 66.2-66.8, 120.5-122.6): the first ring slot full 3.4-5.2 us after the start and
// the blocks' uneven ends. The order's own 3-10% is not its contiguous ranges: the same units dealt
// out in turn (block b reading units b, b + 132, ..., so that the SMs read neighbouring units at
// any moment) read no faster ("I64" in diagnose-read; us, plain / contiguous ranges / dealt out,
// 2-4 units in flight): 28672 x 4096 29.0 / 32.0-32.7 / 31.8-32.6, 8192 x 28672 57.1 / 59.3-59.8
// / 58.6-59.4, 4096 x 14336 17.5 / 19.1-19.2 / 18.8-19.1. Nor is it the row-major layout's
// strided rows: a packed copy of the weights, every unit one contiguous 32 KB read by the same
// TMA boxes, read as slowly in this order (us, native / packed, 3 units in flight: 28672 x 4096
// 32.6 / 32.5, 8192 x 28672 59.2-59.6 / 58.6-58.7, 57344 x 8192 109.6 / 108.7) and moved the op
// at M = 1 and 16 by -0.7 to +1.1 us (4096 x 14336 M = 1 24.6-25.0 / 23.9-24.1, 57344 x 8192
// M = 1 123.4-123.7 / 124.5-125.1, the rest within 0.5 us), not worth a second copy of every
// layer's weights.
//
// Producer: for each unit, four TMA box loads of the weights (64 rows x 128 bytes each, 128-byte
// swizzle; rows past N and bytes past K arrive as zeros) and one bulk copy of every token's
// activations for the chunk (the quantize kernel writes them chunk by chunk: stream_xq_layout)
// into a ring slot, completing on the slot's mbarrier. The ring's first round of weight loads is
// issued before griddepcontrol.wait, so the weight stream starts while the quantize kernel is
// still running; the activation copies follow the wait. Fused (quantizing inside the launch), the
// producer first copies the raw rows into shared memory, then streams the weights alone, and the
// consumers quantize the rows (fused_row_params, fused_quantize_rows) before their first unit.
// After the ring's first round the producer may prefetch the weights of the next l2_prefetch
// units into L2 (one TMA prefetch per box), so that DRAM keeps streaming while the full ring
// waits for the activations; which count pays is timed per layer (stream_s8.cc). Unfused, the
// producer may fill fewer slots before griddepcontrol.wait (StreamS8Args::prefetch), the L2
// prefetch then taking the units right after them; the layer times that too.
//
// Consumers: warp w multiplies rows [16 w, 16 w + 16) of the slot's row block: ldmatrix.x4 of the
// weights (addresses unswizzled) is the A operand of mma.sync.m16n8k32 (s8 x s8 -> s32),
// ldmatrix.x4 of the activations its B operand, 8 tokens per n-block. Token rows in the slot are
// kStreamXRow bytes apart so that ldmatrix's eight row addresses fall in different banks.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <mutex>
#include <type_traits>

#include "kernels/cuda/cluster_launch.h"
#include "kernels/cuda/epilogue_s32_device.cuh"
#include "kernels/cuda/quantize_s8_device.cuh"
#include "kernels/cuda/sm90_async_device.cuh"
#include "kernels/cuda/stream_s8_device.h"

namespace qlinear::gpu {
namespace {

using device::bulk_copy;
using device::grid_dependency_wait;
using device::l2_evict_first;
using device::l2_evict_last;
using device::mbar_arrive;
using device::mbar_expect_tx;
using device::mbar_init;
using device::mbar_init_fence;
using device::mbar_wait;
using device::smem_addr;

constexpr int kConsumerWarps = kStreamRows / 16;
constexpr int kThreads = (kConsumerWarps + 1) * 32;
// A fused launch's block has kHelperWarps more warps, after the producer, that only help the
// consumers quantize the rows and then exit: the quantization runs on twice the warps (one warp
// per SM sub-partition left most of its conversion latency exposed). Twelve (four quantizing
// warps per sub-partition) measured no better on the H200 (bench --diagnose, M = 1): the
// quantization ended 0.4 us sooner on 8192 x 28672 (4.4 -> 4.0 us from the block's start), but
// the statistics step, merging twice the warps' partial statistics, took 0.3-0.4 us longer on
// every layer, and the op was within +-0.6 us (bench: 1.2-1.4 us slower on the 4096-wide layers).
constexpr int kHelperWarps = 4;
constexpr int kFusedThreads = kThreads + kHelperWarps * 32;
// The warps that quantize in a fused launch (consumers and helpers), and a thread's index among
// them.
constexpr int kQuantWarps = kConsumerWarps + kHelperWarps;
__device__ __forceinline__ int quant_tid() {
  const int tid = static_cast<int>(threadIdx.x);
  return tid < kConsumerWarps * 32 ? tid : tid - 32;
}
constexpr int kBox = 128;                         // bytes of K per TMA box (the swizzle span)
constexpr int kBoxes = kStreamChunk / kBox;       // boxes per unit
constexpr int kBoxBytes = kStreamRows * kBox;     // 8 KB, 1024-byte aligned in the slot
constexpr int kWeightBytes = kBoxes * kBoxBytes;  // a slot's weights
constexpr int kMaxStages = 8;
// Ring slots (all filled before the grid dependency). Three measured faster than six on every
// benchmark shape on the H200 (bench --diagnose; 8192 x 28672 at M = 1: 70.0 vs 73.8 us,
// 4096 x 14336: 26.5 vs 30.0 us): fewer weight reads in flight ahead of the quantize kernel's
// own, and less of the L2 held by reads in flight.
constexpr int kDefaultStages = 3;
constexpr int kBarrierBytes = 256;  // the mbarriers, ahead of the ring
constexpr int kAlignSlack = 1024;   // the ring starts at the next 1024-byte boundary (swizzle)

// Ring slot bytes for NT n-blocks: the weight boxes, then the activation rows (1024-aligned).
__host__ __device__ constexpr int slot_bytes(int nt) {
  return (kWeightBytes + 8 * nt * kStreamXRow + 1023) / 1024 * 1024;
}

// Ring slots of a fused launch (quantizing inside the kernel), as the unfused launch's: measured
// on the H200 (bench --diagnose, M = 1, us; 2 / 3 / 4 slots): 6144 x 4096 14.5 / 15.2 / 16.0,
// 28672 x 4096 36.7 / 36.2 / 38.0, 4096 x 14336 24.3 / 23.3 / 24.7, 8192 x 8192 25.1 / 24.9 /
// 25.7, 57344 x 8192 118.1 / 122.9 / 126.0.
constexpr int kFusedStages = 3;

struct KernelParams {
  StreamS8Args a;    // first: its TMA descriptor keeps the 64-byte alignment
  int64_t units;     // row blocks x chunks per row
  int64_t chunks;    // chunks per row: ceil(k / kStreamChunk)
  int stages;        // ring slots
  int prefetch;      // slots filled before the grid dependency
  uint32_t slot;     // bytes per ring slot
  uint32_t xs_off;   // fused: the quantized rows (stream_xq_layout), bytes from the ring's start
  uint32_t raw_off;  // fused: the raw rows [m, k]
  uint32_t aux_off;  // fused: the rows' statistics and parameters (FusedAux)
};

// A fused launch's per-row values in shared memory: each consumer warp's statistics of each row,
// then the rows' parameters (for the quantization and the epilogue).
struct FusedAux {
  device::RowStats stats[kStreamFuseMaxM][kQuantWarps];  // per row and quantizing warp
  device::RowParams rp[kStreamFuseMaxM];
};

// A fused launch's shared memory past the ring, for m rows of k values.
__host__ __device__ constexpr uint32_t fused_xs_bytes(int64_t m, int64_t k) {
  return static_cast<uint32_t>(((k + kStreamChunk - 1) / kStreamChunk * m * kStreamXRow + 127) /
                               128 * 128);
}
__host__ __device__ constexpr uint32_t fused_raw_bytes(int64_t m, int64_t k) {
  return static_cast<uint32_t>((m * k * 2 + 127) / 128 * 128);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// acc (16 x 8, int32) += A (16 x 32 s8, row) * B (32 x 8 s8, col).
__device__ __forceinline__ void mma_s8(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void trace_point(const StreamS8Args& a, int point) {
  if (a.trace != nullptr) a.trace[blockIdx.x * kStreamTracePoints + point] = device::globaltimer();
}

// The quantizing warps' own barrier in a fused launch (the producer warp never joins it).
__device__ __forceinline__ void quant_barrier() {
  asm volatile("bar.sync 1, %0;" ::"n"(kQuantWarps * 32) : "memory");
}

// A fused launch's quantization, by the consumer warps once the raw rows are in shared memory,
// in two steps: every row's statistics (each warp a quarter of the row) and its parameters (SPEC
// section 2, the quantize kernel's device code) into FusedAux, block 0 writing sa and azp for the
// caller; then the rows quantized into xs (stream_xq_layout), block 0 writing xq for the caller
// when asked. Quantizing each K chunk only before the block's first unit of it, one or eight
// chunks at a time, measured slower on the H200 (bench --diagnose, M = 1, us; up front / one /
// eight): 8192 x 8192 24.9 / 29.1 / 26.4, 8192 x 28672 67.4 / 74.4 / 70.8: each step's code and
// barrier cost more than the wait for the whole rows, which the ring's first slots cover.
// kLoads vectors of a row in shared memory, i0, i0 + stride, ... (those before `vecs`), loaded
// before any is used, so that their latencies overlap.
template <int kLoads>
__device__ __forceinline__ void load_vectors(const uint4* row, int64_t i0, int64_t stride,
                                             int64_t vecs, uint4 (&u)[kLoads]) {
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    if (i0 + j * stride < vecs) u[j] = row[i0 + j * stride];
  }
}

template <typename XT, QuantScheme S>
__device__ void fused_row_params(const KernelParams& p, const uint4* raw, FusedAux* aux) {
  const StreamS8Args& a = p.a;
  const int tid = quant_tid(), warp = tid / 32, lane = tid % 32;
  const int M = static_cast<int>(a.m);
  const int64_t vecs = a.k / 8;
  constexpr int kThreadsQ = kQuantWarps * 32;
  constexpr int kLoads = 8;
  for (int r = 0; r < M; ++r) {
    device::WarpRowStats<XT, S> ws;
    for (int64_t i0 = tid; i0 < vecs; i0 += kLoads * kThreadsQ) {
      uint4 u[kLoads];
      load_vectors(raw + r * vecs, i0, kThreadsQ, vecs, u);
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        if (i0 + j * kThreadsQ < vecs) ws.visit8(u[j]);
      }
    }
    const device::RowStats st = ws.reduce();
    if (lane == 0) aux->stats[r][warp] = st;
  }
  quant_barrier();
  if (tid < M) {  // thread r: row r's parameters
    device::RowStats all = aux->stats[tid][0];
#pragma unroll
    for (int w = 1; w < kQuantWarps; ++w) all.merge(aux->stats[tid][w]);
    const device::RowParams rp = device::row_params<S>(all, a.qp);
    aux->rp[tid] = rp;
    if (blockIdx.x == 0) {
      a.sa_out[tid] = rp.sa;
      if (a.azp_out != nullptr && rp.mode != device::kBadRow) a.azp_out[tid] = rp.zp;
    }
  }
  quant_barrier();
  if (tid == 0) trace_point(a, 7);
}

// Every row quantized into xs (stream_xq_layout), kLoads vectors per thread loaded at once.
template <typename XT, QuantScheme S>
__device__ void fused_quantize_rows(const KernelParams& p, const uint4* raw, int8_t* xs,
                                    const FusedAux* aux) {
  const StreamS8Args& a = p.a;
  const int tid = quant_tid();
  const int M = static_cast<int>(a.m);
  const int64_t vecs = a.k / 8;
  constexpr int kThreadsQ = kQuantWarps * 32;
  constexpr int kLoads = 8;
  for (int r = 0; r < M; ++r) {
    const device::RowParams rp = aux->rp[r];
    for (int64_t i0 = tid; i0 < vecs; i0 += kLoads * kThreadsQ) {
      uint4 u[kLoads];
      load_vectors(raw + r * vecs, i0, kThreadsQ, vecs, u);
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int64_t i = i0 + j * kThreadsQ;
        if (i >= vecs) break;
        const uint2 q =
            rp.mode == device::kQuantize ? device::quantize8<XT, S>(u[j], rp) : make_uint2(0, 0);
        const int64_t e = 8 * i;  // a vector never straddles a chunk
        const int64_t off =
            (e / kStreamChunk) * (M * kStreamXRow) + r * kStreamXRow + e % kStreamChunk;
        *reinterpret_cast<uint2*>(xs + off) = q;
        if (a.xq_out != nullptr && blockIdx.x == 0) *reinterpret_cast<uint2*>(a.xq_out + off) = q;
      }
    }
  }
  quant_barrier();
}

template <typename XT>
__device__ void fused_row_params(const KernelParams& p, const uint4* raw, FusedAux* aux) {
  switch (p.a.qp.scheme) {
    case QuantScheme::kDynamicSymmetric:
      return fused_row_params<XT, QuantScheme::kDynamicSymmetric>(p, raw, aux);
    case QuantScheme::kStaticSymmetric:
      return fused_row_params<XT, QuantScheme::kStaticSymmetric>(p, raw, aux);
    case QuantScheme::kDynamicAsymmetric:
      return fused_row_params<XT, QuantScheme::kDynamicAsymmetric>(p, raw, aux);
    case QuantScheme::kStaticAsymmetric:
      return fused_row_params<XT, QuantScheme::kStaticAsymmetric>(p, raw, aux);
  }
}

template <typename XT>
__device__ void fused_quantize_rows(const KernelParams& p, const uint4* raw, int8_t* xs,
                                    const FusedAux* aux) {
  switch (p.a.qp.scheme) {
    case QuantScheme::kDynamicSymmetric:
      return fused_quantize_rows<XT, QuantScheme::kDynamicSymmetric>(p, raw, xs, aux);
    case QuantScheme::kStaticSymmetric:
      return fused_quantize_rows<XT, QuantScheme::kStaticSymmetric>(p, raw, xs, aux);
    case QuantScheme::kDynamicAsymmetric:
      return fused_quantize_rows<XT, QuantScheme::kDynamicAsymmetric>(p, raw, xs, aux);
    case QuantScheme::kStaticAsymmetric:
      return fused_quantize_rows<XT, QuantScheme::kStaticAsymmetric>(p, raw, xs, aux);
  }
}

// The block whose range holds unit u: the largest c with floor(units * c / grid) <= u.
__device__ __forceinline__ int64_t block_of(int64_t u, int64_t units, int64_t grid) {
  return ((u + 1) * grid - 1) / units;
}

// The order a block takes its range [u0, u1) in: the tail [t0, u1) (a row block owned by a later
// block), the whole row blocks [h1, t0), the head [u0, h1) (the block's own row block begun in
// earlier blocks). Empty parts have equal ends.
struct RangeOrder {
  int64_t u0, u1, t0, h1;
  __device__ RangeOrder(int64_t begin, int64_t end, int64_t chunks) : u0(begin), u1(end) {
    const int64_t rb_t = (u1 - 1) / chunks, rb_h = u0 / chunks;
    t0 = u1 < (rb_t + 1) * chunks ? (u0 > rb_t * chunks ? u0 : rb_t * chunks) : u1;
    h1 = u0 > rb_h * chunks ? ((rb_h + 1) * chunks < t0 ? (rb_h + 1) * chunks : t0) : u0;
  }
  __device__ int64_t tail() const { return u1 - t0; }
  __device__ int64_t whole() const { return t0 - h1; }
  // The li-th unit taken.
  __device__ int64_t unit(int64_t li) const {
    if (li < tail()) return t0 + li;
    if (li < tail() + whole()) return h1 + (li - tail());
    return u0 + (li - tail() - whole());
  }
};

// XT: void, or the 16-bit activation type of a fused launch (quantizing inside the kernel; NT 1).
template <int NT, typename XT>
__global__ void __launch_bounds__(std::is_void_v<XT> ? kThreads : kFusedThreads, 1)
    stream_s8_kernel(const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kFuse = !std::is_void_v<XT>;
  extern __shared__ __align__(128) unsigned char smem[];
  const StreamS8Args& a = p.a;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t G = gridDim.x, c = (blockIdx.x + a.range_shift) % G;
  const RangeOrder order(p.units * c / G, p.units * (c + 1) / G, p.chunks);
  const int64_t count = order.u1 - order.u0;
  const int64_t N = a.n, K = a.k;
  const int M = static_cast<int>(a.m);
  const int S = p.stages;
  const uint32_t full0 = smem_addr(smem), empty0 = full0 + 8 * kMaxStages;
  const uint32_t xbar = empty0 + 8 * kMaxStages;  // fused: the raw rows are in
  const uint32_t ring =
      (smem_addr(smem) + kBarrierBytes + kAlignSlack - 1) & ~uint32_t{kAlignSlack - 1};
  unsigned char* const ring_ptr = smem + (ring - smem_addr(smem));

  if (threadIdx.x == 0) {
    trace_point(a, 0);
    if (a.trace != nullptr) {
      uint32_t sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      a.trace[blockIdx.x * kStreamTracePoints + 6] = sm;
    }
    for (int s = 0; s < S; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, kConsumerWarps);
    }
    if constexpr (kFuse) mbar_init(xbar, 1);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    // --- Producer ---
    const uint64_t evict_first = l2_evict_first();
    const uint64_t evict_last = l2_evict_last();
    auto issue = [&](int64_t li, bool arm, bool weights, bool acts) {
      const int64_t u = order.unit(li);
      const int s = static_cast<int>(li % S);
      const int64_t rb = u / p.chunks, kc = u - rb * p.chunks;
      const int64_t n0 = rb * kStreamRows, k0 = kc * kStreamChunk;
      const int64_t len = K - k0 < kStreamChunk ? K - k0 : kStreamChunk;
      const int boxes = static_cast<int>((len + kBox - 1) / kBox);
      const uint32_t bar = full0 + 8 * s;
      const uint32_t slot = ring + static_cast<uint32_t>(s) * p.slot;
      const uint32_t xbytes = kFuse ? 0 : static_cast<uint32_t>(M * kStreamXRow);
      if (arm) {
        // Whole boxes: the TMA counts the zeros it fills past N and K too.
        if (lane == 0) mbar_expect_tx(bar, static_cast<uint32_t>(boxes * kBoxBytes) + xbytes);
        __syncwarp();
      }
      if (weights && lane < boxes) {
        device::tma_load_2d(slot + lane * kBoxBytes, &a.w_map,
                            static_cast<int32_t>(k0 + lane * kBox), static_cast<int32_t>(n0), bar,
                            evict_first);
      }
      if (acts && lane == 0) {
        bulk_copy(slot + kWeightBytes, a.xq + kc * xbytes, xbytes, bar, evict_last);
      }
    };
    // The weights of the l2_prefetch units from `from` on (within the range) into L2, a box per
    // lane.
    auto prefetch = [&](int64_t from) {
      const int64_t to = count < from + a.l2_prefetch ? count : from + a.l2_prefetch;
      for (int64_t li = from; li < to; ++li) {
        const int64_t u = order.unit(li);
        const int64_t rb = u / p.chunks, kc = u - rb * p.chunks;
        const int64_t k0 = kc * kStreamChunk;
        const int64_t len = K - k0 < kStreamChunk ? K - k0 : kStreamChunk;
        if (lane < static_cast<int>((len + kBox - 1) / kBox)) {
          device::tma_prefetch_2d(&a.w_map, static_cast<int32_t>(k0 + lane * kBox),
                                  static_cast<int32_t>(rb * kStreamRows));
        }
      }
    };
    if constexpr (kFuse) {
      // The raw rows first, ahead of this SM's weight copies (every block reads the same rows,
      // from L2 after the first), then the ring, refilled as the consumers free its slots.
      grid_dependency_wait();
      if (lane == 0) {
        trace_point(a, 1);
        const uint32_t bytes = static_cast<uint32_t>(M * K * 2);
        mbar_expect_tx(xbar, bytes);
        bulk_copy(ring + p.raw_off, a.x, bytes, xbar, evict_last);
      }
      for (int64_t li = 0; li < count; ++li) {
        const int s = static_cast<int>(li % S);
        if (li == S) prefetch(S);
        if (li >= S) mbar_wait(empty0 + 8 * s, static_cast<uint32_t>((li / S - 1) & 1));
        issue(li, true, true, false);
      }
      return;
    }
    const int64_t pre_max = p.prefetch < 0 ? 0 : p.prefetch < S ? p.prefetch : S;
    const int64_t pre = count < pre_max ? count : pre_max;
    for (int64_t li = 0; li < pre; ++li) issue(li, true, true, false);
    // The units after those into L2 (after the whole ring when it is all filled here).
    prefetch(pre);
    grid_dependency_wait();
    if (lane == 0) trace_point(a, 1);
    for (int64_t li = 0; li < pre; ++li) issue(li, false, false, true);
    for (int64_t li = pre; li < count; ++li) {
      const int s = static_cast<int>(li % S);
      if (li >= S) mbar_wait(empty0 + 8 * s, static_cast<uint32_t>((li / S - 1) & 1));
      issue(li, true, true, true);
    }
    return;
  }

  // --- Consumers (and, fused, the helper warps until the rows are quantized) ---
  grid_dependency_wait();  // sa, azp and the counters come from the quantize kernel
  FusedAux* const aux = reinterpret_cast<FusedAux*>(ring_ptr + p.aux_off);
  const uint4* const raw = reinterpret_cast<const uint4*>(ring_ptr + p.raw_off);
  int8_t* const xs = reinterpret_cast<int8_t*>(ring_ptr + p.xs_off);
  if constexpr (kFuse) {
    mbar_wait(xbar, 0);
    if (threadIdx.x == 0) trace_point(a, 4);
    fused_row_params<XT>(p, raw, aux);
    fused_quantize_rows<XT>(p, raw, xs, aux);
    if (threadIdx.x == 0) trace_point(a, 5);
    if (warp > kConsumerWarps) return;  // a helper: done
  }
  const int gq = lane / 4, tq = lane % 4;
  // ldmatrix row addresses. Weights: matrices rows 0-7 / 8-15 at k 0-15, then at k 16-31; row r
  // of a box holds its 16-byte unit j at unit j ^ (r % 8) (128-byte swizzle). Activations: the 8
  // tokens at k 0-15, 16-31, 32-47, 48-63.
  const int a_row = 16 * warp + (lane % 8) + 8 * ((lane / 8) % 2);
  const uint32_t a_base = static_cast<uint32_t>(a_row * kBox);
  const int a_unit = lane / 16, a_xor = lane % 8;
  auto a_addr = [&](uint32_t slot, int kbyte) {  // kbyte: a multiple of 32 (the k32 step)
    const int box = kbyte / kBox, unit = (kbyte % kBox) / 16 + a_unit;
    return slot + static_cast<uint32_t>(box * kBoxBytes) + a_base +
           static_cast<uint32_t>((unit ^ a_xor) * 16);
  };
  // Activations: in the slot (8 token rows; rows past M hold stale bytes that only reach outputs
  // past M), or fused in xs, chunk after chunk of M rows (rows past M read row 0).
  const uint32_t b_off =
      static_cast<uint32_t>(kWeightBytes + (lane % 8) * kStreamXRow + 16 * (lane / 8));
  const uint32_t xs_row =
      ring + p.xs_off +
      static_cast<uint32_t>((lane % 8 < M ? lane % 8 : 0) * kStreamXRow + 16 * (lane / 8));
  int32_t acc[NT][4], acc2[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[t][j] = acc2[t][j] = 0;
  }

  // The epilogue for this warp's outputs of row block rb from `v` (the whole K).
  auto epilogue = [&](int64_t rb, const int32_t(&v)[NT][4]) {
    const bool has_bias = a.bias != nullptr;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = rb * kStreamRows + 16 * warp + gq + 8 * h;
      if (n >= N) continue;
      const float sb = a.sb[n];
      const int32_t adj = a.azp_adj != nullptr ? a.azp_adj[n] : 0;
      const float bias_f = has_bias ? device::round_to_y(a.y_type, a.bias[n]) : 0.f;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int m = 8 * t + 2 * tq + j;
          if (m >= M) continue;
          const int32_t total = v[t][2 * h + j];
          const int64_t idx = static_cast<int64_t>(m) * N + n;
          if (a.acc != nullptr) a.acc[idx] = total;
          const int32_t zp = kFuse ? aux->rp[m].zp : a.azp != nullptr ? a.azp[m] : 0;
          const float sa = kFuse ? aux->rp[m].sa : a.sa[m];
          device::store_y(a.y, a.y_type, idx,
                          device::dequant(a.scheme, has_bias, total, sa, zp, sb, adj, bias_f));
        }
      }
    }
  };
  // Where block q keeps its partial sums of its tail's row block.
  auto partial_at = [&](int64_t q) { return a.partials + q * kStreamRows * (8 * NT); };
  auto add_pending = [&] {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[t][j] = static_cast<int32_t>(static_cast<uint32_t>(acc[t][j]) +
                                         static_cast<uint32_t>(acc2[t][j]));
        acc2[t][j] = 0;
      }
    }
  };
  auto clear = [&] {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0;
  };
  // The tail is done: this warp's partial sums of row block rb, then the row block's counter
  // with release semantics (the lanes' stores are ordered before lane 0's increment by the warp
  // barrier), for the owner to add.
  auto publish = [&](int64_t rb) {
    add_pending();
    int32_t* mine = partial_at(c);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + gq + 8 * h;
        *reinterpret_cast<int2*>(mine + r * (8 * NT) + 8 * t + 2 * tq) =
            make_int2(acc[t][2 * h], acc[t][2 * h + 1]);
      }
    }
    __syncwarp();
    if (lane == 0) {
      if constexpr (kFuse) {
        device::store_release(a.flags + c * kConsumerWarps + warp, a.token);
      } else {
        device::red_add_release(a.counters + rb * kConsumerWarps + warp, 1);
      }
    }
    clear();
  };
  // Row block rb is complete in this block's sums: its outputs, after adding the partial sums of
  // the blocks before this one that share it (their tails, taken first; when the head comes
  // last they are published, and the acquire wait is one load).
  auto finish = [&](int64_t rb) {
    add_pending();
    const int64_t first = block_of(rb * p.chunks, p.units, G);
    if (first < c) {
      if (lane == 0) {
        if constexpr (kFuse) {
          for (int64_t q = first; q < c; ++q) {
            while (device::load_acquire(a.flags + q * kConsumerWarps + warp) != a.token) {
              __nanosleep(32);
            }
          }
        } else {
          const int* published = a.counters + rb * kConsumerWarps + warp;
          while (device::load_acquire(published) < static_cast<int>(c - first)) __nanosleep(32);
        }
      }
      __syncwarp();  // orders lane 0's acquire before every lane's reads
      // kBatch blocks' loads in flight at once.
      constexpr int kBatch = 8 / NT;
      for (int64_t q0 = first; q0 < c; q0 += kBatch) {
        int2 v[kBatch][NT][2];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const bool theirs_too = q0 + b < c;
          const int32_t* theirs = partial_at(theirs_too ? q0 + b : c);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = 16 * warp + gq + 8 * h;
              v[b][t][h] = theirs_too ? __ldcg(reinterpret_cast<const int2*>(theirs + r * (8 * NT) +
                                                                             8 * t + 2 * tq))
                                      : make_int2(0, 0);
            }
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
#pragma unroll
          for (int t = 0; t < NT; ++t) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              acc[t][2 * h] = static_cast<int32_t>(static_cast<uint32_t>(acc[t][2 * h]) +
                                                   static_cast<uint32_t>(v[b][t][h].x));
              acc[t][2 * h + 1] = static_cast<int32_t>(static_cast<uint32_t>(acc[t][2 * h + 1]) +
                                                       static_cast<uint32_t>(v[b][t][h].y));
            }
          }
        }
      }
      if constexpr (kFuse) {
        // Read: the flags back to zero for the next launch (which starts after this one ends).
        __syncwarp();
        if (lane == 0) {
          for (int64_t q = first; q < c; ++q) a.flags[q * kConsumerWarps + warp] = 0;
        }
      }
    }
    epilogue(rb, acc);
    clear();
  };

  for (int64_t li = 0; li < count; ++li) {
    const int64_t u = order.unit(li);
    const int s = static_cast<int>(li % S);
    const int64_t rb = u / p.chunks, kc = u - rb * p.chunks;
    const int64_t n0 = rb * kStreamRows, k0 = kc * kStreamChunk;
    const int len = static_cast<int>(K - k0 < kStreamChunk ? K - k0 : kStreamChunk);
    mbar_wait(full0 + 8 * s, static_cast<uint32_t>((li / S) & 1));
    if (li == 0 && threadIdx.x == 0) trace_point(a, 2);
    if (n0 + 16 * warp < N) {  // warp-uniform
      const uint32_t slot = ring + static_cast<uint32_t>(s) * p.slot;
      const uint32_t xrow =
          kFuse ? xs_row + static_cast<uint32_t>(kc * M * kStreamXRow) : slot + b_off;
      // 64 bytes of K: two k32 steps into two accumulator sets (independent mma chains).
      auto step64 = [&](int kb, bool tail) {
        uint32_t a0[4], a1[4];
        ldmatrix_x4(a_addr(slot, kb), a0);
        ldmatrix_x4(a_addr(slot, kb + 32), a1);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          uint32_t b[4];
          ldmatrix_x4(xrow + 8 * t * kStreamXRow + kb, b);
          if (tail) {
            // Bytes past the chunk's end hold stale data: zero activations make them count 0.
#pragma unroll
            for (int j = 1; j < 4; ++j) {
              if (kb + 16 * j >= len) b[j] = 0;
            }
          }
          mma_s8(acc[t], a0, b[0], b[1]);
          if (!tail || kb + 32 < len) mma_s8(acc2[t], a1, b[2], b[3]);
        }
      };
      if (len == kStreamChunk) {
#pragma unroll
        for (int kb = 0; kb < kStreamChunk; kb += 64) step64(kb, false);
      } else {
        for (int kb = 0; kb < len; kb += 64) step64(kb, true);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * s);
    if (li == order.tail() - 1) {
      publish(rb);
    } else if (kc == p.chunks - 1) {  // a whole row block, or the head (it ends its row block)
      finish(rb);
    }
  }
  if (threadIdx.x == 0) trace_point(a, 3);
#endif
}

int max_smem_per_block() {
  static int bytes = [] {
    int device = 0, v = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
      return 0;
    return v;
  }();
  return bytes;
}

// Ring slots for NT n-blocks: as many as the block's shared memory holds (less the static
// shared memory), at most kMaxStages.
template <int NT>
int stages_for() {
  const int stages = (max_smem_per_block() - kBarrierBytes - kAlignSlack - 256) / slot_bytes(NT);
  return stages < kMaxStages ? stages : kMaxStages;
}

template <int NT>
size_t dynamic_smem_bytes() {
  return static_cast<size_t>(kBarrierBytes + kAlignSlack + stages_for<NT>() * slot_bytes(NT));
}

// The kernel's shared-memory limit, set once: what the unfused ring of NT n-blocks needs, or
// (fused) all the block may have.
template <int NT, typename XT>
cudaError_t prepare_kernel() {
  static cudaError_t status = cudaErrorNotYetImplemented;
  static std::once_flag once;
  std::call_once(once, [] {
    const size_t bytes =
        std::is_void_v<XT> ? dynamic_smem_bytes<NT>() : static_cast<size_t>(max_smem_per_block());
    status = stages_for<NT>() < 2
                 ? cudaErrorInvalidConfiguration
                 : cudaFuncSetAttribute(stream_s8_kernel<NT, XT>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes));
  });
  return status;
}

template <int NT, typename XT>
cudaError_t launch_nt(const StreamS8Args& a, cudaStream_t stream) {
  constexpr bool kFuse = !std::is_void_v<XT>;
  if (const cudaError_t e = prepare_kernel<NT, XT>(); e != cudaSuccess) return e;
  KernelParams kp;
  kp.a = a;
  kp.chunks = (a.k + kStreamChunk - 1) / kStreamChunk;
  kp.units = (a.n + kStreamRows - 1) / kStreamRows * kp.chunks;
  size_t smem = 0;
  if constexpr (kFuse) {
    // [ring | xs | raw rows | FusedAux], as many slots (up to kFusedStages, or as asked) as fit.
    const size_t fixed = kBarrierBytes + kAlignSlack + fused_xs_bytes(a.m, a.k) +
                         fused_raw_bytes(a.m, a.k) + sizeof(FusedAux);
    const int64_t room =
        (static_cast<int64_t>(max_smem_per_block()) - static_cast<int64_t>(fixed) - 256) /
        kWeightBytes;
    const int fit = static_cast<int>(room < kMaxStages ? room : kMaxStages);
    if (fit < 2) return cudaErrorInvalidConfiguration;
    const int stages = a.stages > 0 ? a.stages : kFusedStages;
    kp.stages = stages < fit ? stages : fit;
    kp.slot = kWeightBytes;
    kp.xs_off = static_cast<uint32_t>(kp.stages) * kWeightBytes;
    kp.raw_off = kp.xs_off + fused_xs_bytes(a.m, a.k);
    kp.aux_off = kp.raw_off + fused_raw_bytes(a.m, a.k);
    smem = fixed + static_cast<size_t>(kp.stages) * kWeightBytes;
  } else {
    const int stages = a.stages > 0 ? a.stages : kDefaultStages;
    kp.stages = stages < stages_for<NT>() ? stages : stages_for<NT>();
    kp.slot = slot_bytes(NT);
    kp.xs_off = kp.raw_off = kp.aux_off = 0;
    smem = dynamic_smem_bytes<NT>();
  }
  kp.prefetch = a.prefetch != 0 ? a.prefetch : kp.stages;
  // No block without work: the reduction counts every block between a row block's first and last.
  const int64_t grid = a.grid < kp.units ? a.grid : kp.units;
  const DependentLaunch launch(static_cast<unsigned>(grid), kFuse ? kFusedThreads : kThreads, smem,
                               stream, a.pdl);
  return cudaLaunchKernelEx(&launch.config, stream_s8_kernel<NT, XT>, kp);
}

}  // namespace

cudaError_t stream_s8_weights_map(const int8_t* w, int64_t n, int64_t k, StreamTmaMap* map,
                                  int box_rows, int chunks) {
  static_assert(sizeof(StreamTmaMap) == sizeof(CUtensorMap), "StreamTmaMap holds a CUtensorMap");
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  if (chunks < 1 || (chunks > 1 && k % kBox != 0)) return cudaErrorInvalidValue;
  const cuuint32_t rank = chunks > 1 ? 3 : 2;
  const cuuint64_t dims[3] = {chunks > 1 ? kBox : static_cast<cuuint64_t>(k),
                              static_cast<cuuint64_t>(n), static_cast<cuuint64_t>(k / kBox)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(k), kBox};
  const cuuint32_t box[3] = {kBox, static_cast<cuuint32_t>(box_rows),
                             static_cast<cuuint32_t>(chunks)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  // Each L2 fetch promoted to 128 bytes, one box row: promoting to 256 bytes made the weights
  // stream 4-8% slower on the H200. Read alone in this kernel's order (one block per SM, a ring of
  // 32 KB units of four boxes), us, 256 / 128-byte promotion / none, then the same bytes by 1-D
  // bulk copies of 32 KB (a packed layout's read) and by a plain read from every SM: 57344 x 8192
  // 116.0 / 109.7 / 109.8, 107.2, 107.0; 8192 x 28672 60.7 / 58.8 / 59.0, 56.1, 55.5; 28672 x
  // 4096 31.9 / 31.2 / 31.1, 30.4, 29.2; 8192 x 8192 20.6 / 20.2 / 20.2, 19.4, 20.0 (with 3 slots
  // and 128 bytes: 108.0, 57.3, 30.6, 19.7). One 3-D box per unit (128 bytes x 64 rows x 4) read
  // as slowly as the four 2-D boxes; 1-D bulk copies of each row's 512 bytes, twice as slowly.
  // (cuda.cutlass_sm90's descriptors, made by CUTLASS, promote to 128 bytes.) The loads' L2
  // policy stays evict-first: evict-normal, evict-unchanged and evict-last each made the op 2-7%
  // slower (M = 1, 3 slots, us, first / normal / unchanged / last: 8192 x 28672 63.3 / 65.1 /
  // 65.4 / 65.6, 57344 x 8192 115.1 / 116.8 / 116.5 / 116.7, 8192 x 8192 24.5 / 26.0 / 25.6 /
  // 25.7).
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_UINT8,
                            rank, const_cast<int8_t*>(w), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t stream_s8_grid(int64_t n, int64_t k, int* grid) {
  int device = 0, sms = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      e != cudaSuccess) {
    return e;
  }
  const int64_t units = stream_s8_counters(n) * ((k + kStreamChunk - 1) / kStreamChunk);
  *grid = static_cast<int>(units < sms ? units : sms);
  return cudaSuccess;
}

cudaError_t launch_stream_s8(const StreamS8Args& a, cudaStream_t stream) {
  if (a.m < 1 || a.m > kStreamMaxM || a.n < 16 || a.n % 16 != 0 || a.k < 16 || a.k % 16 != 0 ||
      a.grid < 1) {
    return cudaErrorInvalidValue;
  }
  if (a.fuse) {
    if (!stream_s8_can_fuse(a.m, a.k, a.x_type, a.x) || a.flags == nullptr || a.token == 0 ||
        a.sa_out == nullptr) {
      return cudaErrorInvalidValue;
    }
    return a.x_type == ElemType::kBF16 ? launch_nt<1, __nv_bfloat16>(a, stream)
                                       : launch_nt<1, __half>(a, stream);
  }
  switch (stream_m_pad(a.m)) {
    case 8:
      return launch_nt<1, void>(a, stream);
    case 16:
      return launch_nt<2, void>(a, stream);
    default:
      return launch_nt<4, void>(a, stream);
  }
}

}  // namespace qlinear::gpu
