// The device half of cuda.gemv_s8 (see gemv_s8.h): the whole W8A8 op for small M in one launch.
//
// Compiled by nvcc and by the host compiler: plain C++ only (see quantize_s8.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/quantize_s8.h"

namespace qlinear::gpu {

// The largest M the kernel takes (8 tokens per mma.sync n-block, at most 8 blocks).
inline constexpr int64_t kGemvMaxM = 64;

// How one launch divides the work; chosen per layer and M group at load (plan_gemv_s8) and
// passed unchanged to every launch.
//
// The weights are cut into tiles of 16 * row_groups rows. A cluster of split_k blocks owns a
// tile at a time, block r streaming K slice r of it; `clusters` persistent clusters walk the
// tiles c, c + clusters, ... Inside a block, 8 warps = row_groups (16 rows each) x 8/row_groups
// (K sub-slices).
struct GemvS8Plan {
  int row_groups = 8;       // 1, 2, 4 or 8
  int split_k = 1;          // 1..8 blocks per cluster
  int clusters = 1;         // persistent clusters (all co-resident)
  int m_pad = 8;            // 8, 16, 32 or 64: tokens per launch, padded with zero rows
  int chunks = 4;           // 64-byte chunks per load group, 2 or 4 (4 only for m_pad <= 16);
                            // each warp keeps two load groups in flight, in registers
  int smem_bytes = 0;       // dynamic shared memory per block
  double predicted_us = 0;  // the planner's cost model, for logs and benchmarks
  double measured_us = 0;   // set by tune_gemv_s8: the launch's time with a cold L2
};

// Device pointers of one launch. x [m, k] (16-byte aligned, k % 16 == 0); w [n, k] int8 row-major
// (n % 16 == 0); sb [n]; azp_adj [n] (asymmetric schemes, as LayerWeights holds it: folded with
// the zero point for static asymmetric); bias [n] fp32 or null (rounded to y's type in the
// kernel); y [m, n]; sa [m] and azp [m] (azp may be null for symmetric schemes) are outputs;
// xq [m, k] and acc [m, n] are optional debug outputs; trace is for benchmarks.
struct GemvS8Args {
  const void* x = nullptr;
  ElemType x_type = ElemType::kBF16;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  QuantizeParams quant;
  const int8_t* w = nullptr;
  const float* sb = nullptr;
  const int32_t* azp_adj = nullptr;
  const float* bias = nullptr;
  void* y = nullptr;
  ElemType y_type = ElemType::kBF16;
  float* sa = nullptr;
  int32_t* azp = nullptr;
  int8_t* xq = nullptr;
  int32_t* acc = nullptr;
  // Benchmarks only: when set, thread 0 of every block writes kGemvTracePoints %globaltimer
  // stamps (ns) at trace[block * kGemvTracePoints + i]: entry, row statistics reduced in the
  // block, statistics merged over the cluster, activations quantized, the last tile's weights
  // multiplied (after the cluster barrier), exit.
  uint64_t* trace = nullptr;
};

inline constexpr int kGemvTracePoints = 6;

// The padded token count for m rows (m <= kGemvMaxM).
inline int gemv_m_pad(int64_t m) { return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64; }

// Whether some split of K leaves the quantized activations of m_pad tokens room in shared memory
// (every device of compute capability 9.0 then has room for at least one cluster). Plain host
// code: can_implement asks it without a device.
bool gemv_s8_fits(int64_t k, int m_pad);

// Chooses the plan for n x k weights and up to m_pad tokens on the current device with a cost
// model (weight bytes streamed including round imbalance, activation re-reads, per-tile and
// per-cluster overheads) over every (row_groups, split_k) whose shared memory fits; the cluster
// count comes from cudaOccupancyMaxActiveClusters. cudaErrorNotSupported when nothing fits
// (the caller declines the layer for that M).
cudaError_t plan_gemv_s8(int64_t n, int64_t k, int m_pad, int x_elem_bytes, GemvS8Plan* plan);

// Fills `plan` for a given (row_groups, split_k, chunks) (benchmarks sweep these; chunks 0 = the
// default for m_pad); cudaErrorNotSupported when that split cannot run this shape.
cudaError_t plan_gemv_s8_fixed(int64_t n, int64_t k, int m_pad, int x_elem_bytes, int row_groups,
                               int split_k, GemvS8Plan* plan, int chunks = 0);

// Times the cost model's best `candidates` plans (every (row_groups, split_k, chunks) that fits
// when candidates is at least their number) for args (m = the group's m_pad rows; x, y and
// sa device buffers of that size; the layer's w, sb, ...), each the median of five launches
// after `flush` (a buffer of at least the L2's size) has been read so that the weights come from
// HBM, and returns the fastest in *plan. Synchronises `stream`: for load time only.
cudaError_t tune_gemv_s8(const GemvS8Args& args, int m_pad, void* flush, size_t flush_bytes,
                         int candidates, cudaStream_t stream, GemvS8Plan* plan);

// Enqueues the op: per-token quantization of x (sa, azp, and xq when asked) inside the launch,
// the int8 GEMV/GEMM with exact int32 accumulation (mma.sync m16n8k32), split-K reduced through
// distributed shared memory, and the SPEC section 4 epilogue in its exact order. A row holding
// NaN/Inf gets sa = NaN and unspecified outputs. args.m <= plan.m_pad. Returns the launch error.
cudaError_t launch_gemv_s8(const GemvS8Args& args, const GemvS8Plan& plan, cudaStream_t stream);

}  // namespace qlinear::gpu
