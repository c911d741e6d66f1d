// The mainloop of cuda.cutlass_sm90's quantizing tiles: CUTLASS's Hopper TMA warp-specialized
// int8 mainloop, plus the activations' quantization done inside the GEMM launch by a warp that the
// pingpong kernel otherwise leaves idle.
//
// Why: at large M the GEMM is bound by the tensor cores while the SM's load units and DRAM sit
// mostly idle, and a separate quantize pass over M x K 16-bit activations (up to 128 MB at
// 8192 x 8192) costs 10-15% of the op. Here that pass runs underneath the MMAs:
//
//   - The quantize kernel (launched just before, the GEMM being its programmatic dependent)
//     quantizes only the first `prefix` rows, which the first tiles need at once, and zeroes the
//     counters below.
//   - The producer warpgroup's fourth warp (the kernel's "MainloopAux" role, see CUTLASS's
//     sm90_gemm_tma_warpspecialized_pingpong.hpp) of every CTA claims the remaining rows
//     kAuxClaimRows at a time from a global counter, in order, and quantizes each: a bulk copy
//     brings the row into a shared-memory ring (rows ahead in flight while it works on the current
//     one), a first pass finds the row's statistics, a second writes xq, sa and azp exactly as the
//     quantize kernel does (the same device code, quantize_s8_device.cuh); after a claim's last
//     row, one fence and a release increment of the m-block counter publish the claim's rows.
//   - The mainloop producer, before the TMA loads of a tile, waits (acquire) until every row of
//     the tile's m-block is published. The tile scheduler walks the tiles along N first, so
//     tiles ask for m-blocks in the order the rows are handed out.
//
// No deadlock is possible whatever the residency: a row is claimed only by a running warp, which
// finishes it without waiting on anything; a CTA waiting for an unclaimed row has its own
// auxiliary warp claiming rows.
//
// Where every tile lies in the grid's first wave (QuantizeInGemm::unit_rows > 0; prefix 0, the
// kernel launched first only zeroes the counters) the rows are quantized in the mainloop's set-up
// instead, which every thread of the CTA runs before the warps take their roles: CTA c issues the
// loads of its unit (unit_rows rows, all its threads' 16-byte vectors at once, at most
// kPrologueVecs a thread) before the grid dependency wait, claims the unit by its bit in the flags
// after it, and quantizes it from registers: the rows' statistics meet in shared memory (the
// ring's first bytes), and one release increment per m-block publishes them. A unit whose CTA
// never claims it (a CTA not yet resident, or one of the units past QuantizeInGemm::owned_units)
// is taken by an auxiliary warp: each one waits until every row is published or
// kPrologueStealAfterNs have passed, then draws units from counters[0] and quantizes any it
// claims itself. So here too a row is claimed only by a running warp that finishes it without
// waiting.
//
// Activations must be 16-bit (bf16 or fp16), 16-byte aligned, with a row of at most
// kAuxRingBytes (with the set-up's quantization, rows that a unit's threads hold: up to
// kPrologueVecs * 8 * kPrologueThreads / unit_rows values); the caller uses the plain tiles
// otherwise.
//
// Base is the DependentMainloop (cutlass_sm90_dependent_mainloop.cuh) of the stock mainloop.
//
// CUDA only; needs the CUTLASS headers and sm_90a.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "kernels/cuda/cutlass_sm90_device.h"
#include "kernels/cuda/quantize_s8_device.cuh"
#include "kernels/cuda/sm90_async_device.cuh"

namespace qlinear::gpu::cutlass_sm90 {

// A distinct dispatch policy, so that the kernel sees an auxiliary load (below) and runs the
// fourth producer warp; everything else is the stock policy's.
template <class Policy>
struct QuantizingPolicy : Policy {};

}  // namespace qlinear::gpu::cutlass_sm90

namespace cutlass::gemm::kernel::detail {
template <class Policy>
struct HasAuxiliaryLoad<qlinear::gpu::cutlass_sm90::QuantizingPolicy<Policy>> : cute::true_type {};
}  // namespace cutlass::gemm::kernel::detail

namespace qlinear::gpu::cutlass_sm90 {

// Rows in flight in the auxiliary warp's ring at most (the ring is kAuxRingBytes).
inline constexpr int kAuxSlots = 4;
// Rows an auxiliary warp claims at once (one atomic), and publishes at once (one fence and one
// release increment per m-block they touch), once it has quantized them all.
inline constexpr int kAuxClaimRows = 4;
// Shared memory the quantizing mainloop adds (its ring, mbarriers and row slots, with slack for
// their alignment), set aside before CUTLASS picks the stage count.
inline constexpr int kAuxExtraSmem = kAuxRingBytes + 256;
// 16-byte vectors of a unit one thread of the set-up's quantization holds (80 registers of the
// pingpong kernel's 168): rows of up to kPrologueVecs * 8 * 384 / unit_rows values.
inline constexpr int kPrologueVecs = 20;
// Threads of the kernel (three warpgroups), and so rows per unit the set-up may take: those that
// divide its warps evenly among a unit's rows.
inline constexpr int kPrologueThreads = 384;
inline constexpr int kPrologueUnitRows[] = {1, 2, 3, 4, 6, 12};
// How long an auxiliary warp waits for the CTAs' own units before it takes those left unclaimed.
inline constexpr uint64_t kPrologueStealAfterNs = 20000;

template <class Base>
struct QuantizingMainloop : Base {
  using DispatchPolicy = QuantizingPolicy<typename Base::DispatchPolicy>;
  static constexpr int kBlockM = cute::size<0>(typename Base::TileShape{});

  struct TensorStorage : Base::TensorStorage {
    alignas(128) uint8_t ring[kAuxRingBytes];
    alignas(8) uint64_t bars[kAuxSlots];
    int rows[kAuxSlots];
  };
  // Shared memory this adds to the stock mainloop's (for the stage count's carve-out).
  static constexpr int kExtraSmem =
      static_cast<int>(sizeof(TensorStorage) - sizeof(typename Base::TensorStorage));
  static_assert(kExtraSmem <= kAuxExtraSmem, "the stage count set aside too little for the ring");

  struct Arguments : Base::Arguments {
    QuantizeInGemm q;
  };
  struct Params : Base::Params {
    QuantizeInGemm q;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape,
                                                  Arguments const& args, void* workspace) {
    return Params{Base::to_underlying_arguments(problem_shape, args, workspace), args.q};
  }

  // The stock producer's loads of a tile, once every row of its m-block is quantized.
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int thread_idx, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    device::grid_dependency_wait();  // the counters and the prefix rows
    wait_for_rows(params.q, static_cast<int>(cute::get<0>(blk_coord)));
    Base::load(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, k_tile_count,
               thread_idx, block_rank_in_cluster, shared_tensors);
  }

  // The mainloop's set-up, which every thread of the CTA runs: with unit_rows, the CTA's own unit
  // of rows quantized first.
  template <class ProblemShape>
  CUTLASS_DEVICE auto load_init(ProblemShape const& problem_shape, Params const& params) const {
    const QuantizeInGemm& q = params.q;
    if (q.unit_rows > 0) {
      if (q.x_type == ElemType::kF16) {
        prologue<__half>(q);
      } else {
        prologue<__nv_bfloat16>(q);
      }
    }
    return Base::load_init(problem_shape, params);
  }

  // Called by the auxiliary warp once per tile of its CTA: the first call quantizes rows until
  // none is left; the others return at once.
  template <class Pipeline, class PipelineState, class LoadInputs, class BlockCoord,
            class KTileIterator>
  CUTLASS_DEVICE void load_auxiliary(Params const& params, Pipeline, PipelineState,
                                     LoadInputs const&, BlockCoord const&, KTileIterator, int, int,
                                     uint32_t, TensorStorage& shared_tensors) {
    if (aux_done_) return;
    aux_done_ = true;
    device::grid_dependency_wait();  // the counters, zeroed by the quantize kernel
    const QuantizeInGemm& q = params.q;
    if (q.unit_rows > 0) {
      if (q.x_type == ElemType::kF16) {
        take_left_units<__half>(q);
      } else {
        take_left_units<__nv_bfloat16>(q);
      }
      return;
    }
    if (q.x_type == ElemType::kF16) {
      quantize_rows<__half>(q, shared_tensors);
    } else {
      quantize_rows<__nv_bfloat16>(q, shared_tensors);
    }
  }

 private:
  bool aux_done_ = false;

  static CUTLASS_DEVICE void wait_for_rows(const QuantizeInGemm& q, int mb) {
    const int lo = max(mb * kBlockM, q.prefix);
    const int hi = min((mb + 1) * kBlockM, q.m);
    if (hi <= lo) return;
    const int* done = q.counters + 1 + mb;
    while (device::load_acquire(done) < hi - lo) __nanosleep(64);
    // The rows were stored by other SMs' plain stores; this warp's TMA loads read them.
    device::fence_proxy_async_global();
  }

  template <class T>
  static CUTLASS_DEVICE void quantize_rows(const QuantizeInGemm& q, TensorStorage& s) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const uint32_t row_bytes = static_cast<uint32_t>(q.k) * 2;
    const uint32_t stride = (row_bytes + 127) / 128 * 128;
    const int slots = min(kAuxSlots, static_cast<int>(kAuxRingBytes / stride));
    const uint32_t bar0 = device::smem_addr(s.bars);
    const uint32_t ring = device::smem_addr(s.ring);
    if (lane == 0) {
      for (int i = 0; i < slots; ++i) device::mbar_init(bar0 + 8 * i, 1);
      device::mbar_init_fence();
    }
    __syncwarp();
    const uint64_t evict_first = device::l2_evict_first();
    int issued = 0, processed = 0;
    int next = 0, end = 0;  // claimed rows whose copies are not issued yet
    bool exhausted = false;
    // Claims rows, kAuxClaimRows at a time, and starts their copies while ring slots are free.
    auto fill = [&] {
      while (!exhausted && issued - processed < slots) {
        if (next == end) {
          int first = 0;
          if (lane == 0) first = q.prefix + atomicAdd(q.counters, kAuxClaimRows);
          first = __shfl_sync(0xffffffffu, first, 0);
          if (first >= q.m) {
            exhausted = true;
            break;
          }
          next = first;
          end = min(first + kAuxClaimRows, q.m);
        }
        const int row = next++;
        const int slot = issued % slots;
        if (lane == 0) {
          s.rows[slot] = row;
          const uint32_t bar = bar0 + 8 * slot;
          device::mbar_expect_tx(bar, row_bytes);
          device::bulk_copy(ring + slot * stride,
                            static_cast<const uint8_t*>(q.x) + static_cast<size_t>(row) * row_bytes,
                            row_bytes, bar, evict_first);
        }
        ++issued;
      }
      __syncwarp();
    };
    fill();
    while (processed < issued) {
      const int slot = processed % slots;
      device::mbar_wait(bar0 + 8 * slot, static_cast<uint32_t>((processed / slots) & 1));
      const int row = s.rows[slot];
      const uint4* src = reinterpret_cast<const uint4*>(s.ring + slot * stride);
      quantize_row<T>(q, src, row, lane);
      // Every lane's reads of the slot are done before a bulk copy refills it.
      device::fence_proxy_async_shared();
      __syncwarp();
      // The claim's last row: publish the claim's rows.
      const int claim = q.prefix + (row - q.prefix) / kAuxClaimRows * kAuxClaimRows;
      const int claim_end = min(claim + kAuxClaimRows, q.m);
      if (row + 1 == claim_end) publish(q, claim, claim_end, lane);
      ++processed;
      fill();
    }
  }

  // One row (8 values per 16-byte vector), in the layer's scheme.
  template <class T>
  static CUTLASS_DEVICE void quantize_row(const QuantizeInGemm& q, const uint4* src, int row,
                                          int lane) {
    switch (q.qp.scheme) {
      case QuantScheme::kDynamicSymmetric:
        return quantize_row<T, QuantScheme::kDynamicSymmetric>(q, src, row, lane);
      case QuantScheme::kStaticSymmetric:
        return quantize_row<T, QuantScheme::kStaticSymmetric>(q, src, row, lane);
      case QuantScheme::kDynamicAsymmetric:
        return quantize_row<T, QuantScheme::kDynamicAsymmetric>(q, src, row, lane);
      default:
        return quantize_row<T, QuantScheme::kStaticAsymmetric>(q, src, row, lane);
    }
  }

  // One row from shared memory or global memory (8 values per 16-byte vector), as
  // quantize_rows_s8 does it.
  template <class T, QuantScheme S>
  static CUTLASS_DEVICE void quantize_row(const QuantizeInGemm& q, const uint4* src, int row,
                                          int lane) {
    const int vecs = q.k / 8;
    device::WarpRowStats<T, S> ws;
    for (int i = lane; i < vecs; i += 32) ws.visit8(src[i]);
    const device::RowParams rp = device::row_params<S>(ws.reduce(), q.qp);
    if (lane == 0) {
      q.sa[row] = rp.sa;
      if (q.azp != nullptr && rp.mode != device::kBadRow) q.azp[row] = rp.zp;
    }
    if (rp.mode != device::kBadRow) {
      uint2* out = reinterpret_cast<uint2*>(q.xq + static_cast<size_t>(row) * q.k);
      for (int i = lane; i < vecs; i += 32) {
        out[i] =
            rp.mode == device::kQuantize ? device::quantize8<T, S>(src[i], rp) : make_uint2(0, 0);
      }
    }
  }

  // Publishes rows [lo, hi), quantized by this warp: every lane's stores, ordered for the TMA
  // loads of other SMs, then the count of each m-block they belong to.
  static CUTLASS_DEVICE void publish(const QuantizeInGemm& q, int lo, int hi, int lane) {
    __threadfence();
    device::fence_proxy_async_global();
    __syncwarp();
    if (lane == 0) count_rows(q, lo, hi);
  }

  // The release increments of the m-blocks' counters for rows [lo, hi), whose stores are ordered
  // before (by the caller's fences).
  static CUTLASS_DEVICE void count_rows(const QuantizeInGemm& q, int lo, int hi) {
    while (lo < hi) {
      const int mb = lo / kBlockM;
      const int top = min(hi, (mb + 1) * kBlockM);
      device::red_add_release(q.counters + 1 + mb, top - lo);
      lo = top;
    }
  }

  // The set-up's units: unit u is rows [u * unit_rows, (u + 1) * unit_rows) of m.
  static CUTLASS_DEVICE int prologue_units(const QuantizeInGemm& q) {
    return (q.m + q.unit_rows - 1) / q.unit_rows;
  }

  // Claims unit u (one thread): whether this call set its flag.
  static CUTLASS_DEVICE bool claim_unit(const QuantizeInGemm& q, int u) {
    unsigned* flags = reinterpret_cast<unsigned*>(q.counters + quantizing_tile_flags_offset(q.m));
    const unsigned bit = 1u << (u % 32);
    return (atomicOr(flags + u / 32, bit) & bit) == 0;
  }

  // The CTA's own unit, quantized by all kPrologueThreads threads in the mainloop's set-up (see
  // the file comment): the rows split evenly among the warps, each thread holding its vectors of
  // its row in registers from the loads (issued before the grid dependency wait) to the stores.
  template <class T>
  static CUTLASS_DEVICE void prologue(const QuantizeInGemm& q) {
    switch (q.qp.scheme) {
      case QuantScheme::kDynamicSymmetric:
        return prologue<T, QuantScheme::kDynamicSymmetric>(q);
      case QuantScheme::kStaticSymmetric:
        return prologue<T, QuantScheme::kStaticSymmetric>(q);
      case QuantScheme::kDynamicAsymmetric:
        return prologue<T, QuantScheme::kDynamicAsymmetric>(q);
      default:
        return prologue<T, QuantScheme::kStaticAsymmetric>(q);
    }
  }

  template <class T, QuantScheme S>
  static CUTLASS_DEVICE void prologue(const QuantizeInGemm& q) {
    extern __shared__ char prologue_smem[];  // the kernel's shared storage
    auto* s_stats = reinterpret_cast<device::RowStats*>(prologue_smem + q.scratch_offset);
    int* s_unit = reinterpret_cast<int*>(s_stats + kPrologueThreads / 32);
    const int tid = static_cast<int>(threadIdx.x);
    const int group = kPrologueThreads / q.unit_rows;  // threads per row, whole warps
    const int g = tid / group, gt = tid % group;
    const int vecs = q.k / 8;
    const int cta =
        static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    const int own = cta < q.owned_units ? cta : -1;
    const int row0 = own * q.unit_rows + g;
    uint4 raw[kPrologueVecs];
    if (own >= 0 && row0 < q.m) {
      const uint4* xr = reinterpret_cast<const uint4*>(static_cast<const T*>(q.x) +
                                                       static_cast<size_t>(row0) * q.k);
#pragma unroll
      for (int c = 0; c < kPrologueVecs; ++c) {
        if (gt + c * group < vecs) raw[c] = xr[gt + c * group];
      }
    }
    device::grid_dependency_wait();  // the counters, zeroed by the kernel launched first
    if (tid == 0) *s_unit = own >= 0 && claim_unit(q, own) ? own : -1;
    __syncthreads();
    const int unit = *s_unit;
    if (unit < 0) return;  // (the same for every thread)
    const int row = unit * q.unit_rows + g;
    device::WarpRowStats<T, S> ws;
    if (row < q.m) {
#pragma unroll
      for (int c = 0; c < kPrologueVecs; ++c) {
        if (gt + c * group < vecs) ws.visit8(raw[c]);
      }
    }
    const device::RowStats warp_stats = ws.reduce();
    if (tid % 32 == 0) s_stats[tid / 32] = warp_stats;
    __syncthreads();
    if (row < q.m) {
      const int w0 = g * (group / 32);
      device::RowStats all = s_stats[w0];
      for (int w = 1; w < group / 32; ++w) all.merge(s_stats[w0 + w]);
      const device::RowParams rp = device::row_params<S>(all, q.qp);
      if (gt == 0) {
        q.sa[row] = rp.sa;
        if (q.azp != nullptr && rp.mode != device::kBadRow) q.azp[row] = rp.zp;
      }
      if (rp.mode != device::kBadRow) {
        uint2* out = reinterpret_cast<uint2*>(q.xq + static_cast<size_t>(row) * q.k);
#pragma unroll
        for (int c = 0; c < kPrologueVecs; ++c) {
          const int i = gt + c * group;
          if (i < vecs) {
            out[i] = rp.mode == device::kQuantize ? device::quantize8<T, S>(raw[c], rp)
                                                  : make_uint2(0, 0);
          }
        }
      }
    }
    // Every thread's stores, ordered for the TMA loads of other SMs, then the unit's rows counted.
    __threadfence();
    device::fence_proxy_async_global();
    __syncthreads();
    if (tid == 0) count_rows(q, unit * q.unit_rows, min((unit + 1) * q.unit_rows, q.m));
  }

  // Whether every row is published (the counters of every m-block full).
  static CUTLASS_DEVICE bool all_rows_published(const QuantizeInGemm& q) {
    for (int lo = 0; lo < q.m; lo += kBlockM) {
      if (device::load_acquire(q.counters + 1 + lo / kBlockM) < min(kBlockM, q.m - lo))
        return false;
    }
    return true;
  }

  // The auxiliary warp with the set-up's quantization: once every row is published it returns;
  // if kPrologueStealAfterNs pass first, it draws units from counters[0] until none is left and
  // quantizes each one it claims (one row at a time, from global memory: a fallback). Lane 0
  // decides each step for the whole warp (the steps use full-warp shuffles).
  template <class T>
  static CUTLASS_DEVICE void take_left_units(const QuantizeInGemm& q) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const uint64_t start = device::globaltimer();
    for (;;) {
      int step = 0;  // 0: wait, 1: every row published, 2: take the units left
      if (lane == 0) {
        step = all_rows_published(q)                                   ? 1
               : device::globaltimer() - start < kPrologueStealAfterNs ? 0
                                                                       : 2;
      }
      step = __shfl_sync(0xffffffffu, step, 0);
      if (step == 1) return;
      if (step == 0) {
        __nanosleep(1000);
        continue;
      }
      const int units = prologue_units(q);
      for (;;) {
        int u = 0;
        bool mine = false;
        if (lane == 0) {
          u = atomicAdd(q.counters, 1);
          mine = u < units && claim_unit(q, u);
        }
        u = __shfl_sync(0xffffffffu, u, 0);
        mine = __shfl_sync(0xffffffffu, mine, 0);
        if (u >= units) return;
        if (!mine) continue;
        const int lo = u * q.unit_rows, hi = min(lo + q.unit_rows, q.m);
        for (int row = lo; row < hi; ++row) {
          const uint4* src = reinterpret_cast<const uint4*>(static_cast<const T*>(q.x) +
                                                            static_cast<size_t>(row) * q.k);
          quantize_row<T>(q, src, row, lane);
        }
        publish(q, lo, hi, lane);
      }
    }
  }
};

}  // namespace qlinear::gpu::cutlass_sm90
