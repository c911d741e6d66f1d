// The mainloop every cuda.cutlass_sm90 tile runs: CUTLASS's Hopper TMA warp-specialized int8
// mainloop, which, launched as the quantize kernel's programmatic dependent, starts streaming its
// first tile's weights into L2 before it waits for the quantized activations.
//
// Why: at small M the op is the weights' stream from DRAM, and the quantize kernel before the
// GEMM (1-4 us with its launch) left DRAM idle: the GEMM's producer waited on the grid dependency
// (griddepcontrol.wait) before any load, weights included. The weights do not depend on the
// quantize kernel, so the producer of each CTA first issues TMA L2 prefetches for the weights of
// the first k-tiles of its first tile (up to weight_prefetch_bytes), then waits, then runs the
// stock loads, which find those weights in L2. The gain is small (0.1-0.7 us, the table beside
// kWeightPrefetchBytes in cutlass_sm90_gemm.cc): a CTA cannot share an SM with a quantize block,
// so only the CTAs on the other SMs prefetch early.
//
// With weights_ahead (tiles without a cluster) the producer also starts the first tile's
// pipeline before the wait: it takes the first weights_ahead stages (at most the tile's k-tiles;
// FusedGemm passes every stage the pipeline holds, or fewer) and issues the TMA loads of their
// weights into shared memory, then waits, then issues the activations' loads into the same stages
// (each stage's barrier expects both, so the consumers see a stage only when its activations are in
// too), and the stock loads go on from the next k-tile. The weights then stream into the SM while
// the quantize kernel runs, not only into L2.
//
// With weights_evict_first (where each weight tile is read by one CTA, or by one cluster through
// multicast: the tile's m-blocks fit in one cluster) the weights' TMA loads carry an evict-first
// L2 hint: the weights stream through L2 once, and evicting them first keeps the activations and
// the lines still in flight there. The stock loop is otherwise unchanged (load_tiles).
//
// With tail_prefetch_bytes (tiles without a cluster, calls of one token block), where the tiles
// outnumber the persistent grid's CTAs, the CTAs that own no tile of the last, partial wave
// prefetch the first k-tiles of that wave's tiles into L2 at their start: the last wave's
// pipelines then start from L2, not DRAM, while the other SMs have gone idle.
//
// With xq_rows (CutlassSm90Args) the activations' TMA descriptor covers that many rows instead of
// the problem's M: a token block's rows past M are then loaded from the buffer like any others
// rather than zero-filled as out of bounds, which stalled the weights' stream (the table is
// beside kReadWholeTokenBlocks in cutlass_sm90_gemm.cc). The kernel's problem shape, and with
// it the tile scheduler and the epilogue's predicates, keeps the real M.
//
// The wait lives here, not in the kernel: the library is built without CUTLASS's own grid
// dependency control (CUTLASS_ENABLE_GDC_FOR_SM90), which would wait before the mainloop's first
// call. Every read of the quantize kernel's results follows this wait: the producer's TMA loads of
// xq directly, the consumers' epilogue reads of sa and azp through the pipeline's barriers (the
// epilogue has no producer loads), and the quantizing mainloop waits the same way before it
// reads its counters. Without a programmatic launch griddepcontrol.wait returns at once.
//
// With kWeightsA (the tiles with their operands swapped, cutlass_sm90_gemm.cuh) the weights are
// the GEMM's A operand and the activations its B: everything above applies to A's loads instead.
//
// With kClaim (the tiles whose CTAs claim their tiles at run time,
// cutlass_sm90_claiming_scheduler.cuh) and a claim lead, the producer tells the scheduler warp when
// to draw the next tile: once `claim_lead` k-tiles of the current tile's loads are left to issue.
//
// CUDA only; needs the CUTLASS headers and sm_90a.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "kernels/cuda/cutlass_sm90_claiming_scheduler.cuh"
#include "kernels/cuda/cutlass_sm90_device.h"
#include "kernels/cuda/sm90_async_device.cuh"

namespace qlinear::gpu::cutlass_sm90 {

template <class Base, bool kWeightsA = false, bool kClaim = false>
struct DependentMainloop : Base {
  using TileShape = typename Base::TileShape;
  // The GEMM's extents (0: M, 1: N) that hold the weights' channels and the activations' tokens.
  static constexpr int kChannelDim = kWeightsA ? 0 : 1;
  static constexpr int kTokenDim = kWeightsA ? 1 : 0;
  // Bytes of weights in one k-tile of a tile (int8: channels x K).
  static constexpr int kWeightTileBytes =
      cute::size<kChannelDim>(TileShape{}) * cute::size<2>(TileShape{});
  using GmemTiledCopyW =
      std::conditional_t<kWeightsA, typename Base::GmemTiledCopyA, typename Base::GmemTiledCopyB>;
  // The prefetch is issued by each CTA for its own weights; with a cluster the weights would be
  // multicast between CTAs, and these tiles do not prefetch.
  static constexpr bool kCanPrefetch = std::is_same_v<GmemTiledCopyW, cute::SM90_TMA_LOAD>;

  struct Arguments : Base::Arguments {
    int weight_prefetch_bytes = 0;  // per CTA, before the grid dependency wait; 0: none
    uint64_t* trace = nullptr;      // CutlassSm90Args::trace
    int weights_ahead = 0;          // stages whose weights go into shared memory before it; 0: none
    bool weights_evict_first = false;  // the weights' loads with an evict-first L2 hint
    int xq_rows = 0;                   // the activations' TMA extent in rows (0: the problem's M)
    int tail_prefetch_bytes = 0;       // of the last wave's weights, into L2, over all its tiles
    int claim_lead = 0;  // kClaim: k-tiles left to issue when the next tile is drawn; 0: no signal
    uint32_t* claim_signals = nullptr;  // kClaim: the workspace's words per CTA (null: no signal)
  };
  struct Params : Base::Params {
    int weight_prefetch_bytes = 0;
    uint64_t* trace = nullptr;
    int weights_ahead = 0;
    bool weights_evict_first = false;
    int tail_prefetch_bytes = 0;
    int claim_lead = 0;
    uint32_t* claim_signals = nullptr;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape,
                                                  Arguments const& args, void* workspace) {
    ProblemShape shape = problem_shape;
    if (args.xq_rows > cute::get<kTokenDim>(shape)) cute::get<kTokenDim>(shape) = args.xq_rows;
    return Params{Base::to_underlying_arguments(shape, args, workspace),
                  args.weight_prefetch_bytes,
                  args.trace,
                  args.weights_ahead,
                  args.weights_evict_first,
                  args.tail_prefetch_bytes,
                  kClaim ? args.claim_lead : 0,
                  kClaim ? args.claim_signals : nullptr};
  }

  // The mainloop's set-up, which every thread runs after the pipelines' barriers are made: its
  // first thread's clock is stamped (point 8) where params.trace is set.
  template <class ProblemShape>
  CUTLASS_DEVICE auto load_init(ProblemShape const& problem_shape, Params const& params) const {
    if (params.trace != nullptr && threadIdx.x == 0) clock_stamp(params, 8);
    return Base::load_init(problem_shape, params);
  }

  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int thread_idx, uint32_t block_rank_in_cluster,
                           typename Base::TensorStorage& shared_tensors) {
    if (!waited_) {
      waited_ = true;
      trace(params, 0);
      int ahead = 0;
      if constexpr (kCanPrefetch) {
        ahead = min(min(k_tile_count, params.weights_ahead), Base::DispatchPolicy::Stages);
        if (ahead > 0) {
          load_stages(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, ahead,
                      shared_tensors, /*weights=*/true);
        }
        KTileIterator rest = k_tile_iter;
        for (int i = 0; i < ahead; ++i) ++rest;
        prefetch_weights(params, cute::get<kChannelDim>(load_inputs), blk_coord, rest,
                         k_tile_count - ahead);
        prefetch_tail(params, cute::get<kChannelDim>(load_inputs), cute::get<3>(blk_coord));
      }
      device::grid_dependency_wait();
      trace(params, 1);
      if constexpr (kCanPrefetch) {
        if (ahead > 0) {
          load_stages(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, ahead,
                      shared_tensors, /*weights=*/false);
          for (int i = 0; i < ahead; ++i, ++k_tile_iter) ++smem_pipe_write;
          k_tile_count -= ahead;
        }
      }
    }
    ++tiles_;
    // Where the scheduler warp may draw the next tile: before the load of this many k-tiles of the
    // rest (-1: no signal).
    const int claim_at = kClaim && params.claim_lead > 0 && params.claim_signals != nullptr
                             ? max(k_tile_count - params.claim_lead, 0)
                             : -1;
    if (params.weights_evict_first) {
      load_tiles(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter,
                 k_tile_count, block_rank_in_cluster, shared_tensors, claim_at, tiles_);
    } else {
      if (claim_at >= 0 && cute::elect_one_sync()) signal_claim(params, tiles_);
      __syncwarp();
      Base::load(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter,
                 k_tile_count, thread_idx, block_rank_in_cluster, shared_tensors);
    }
    trace(params, 2);
  }

  // The CTA's start, stamped (point 6) where params.trace is set: CUTLASS's kernels call this from
  // one thread first thing.
  static CUTLASS_DEVICE void prefetch_tma_descriptors(Params const& params) {
    if (params.trace != nullptr) {
      trace_slots(params)[6] = device::globaltimer();
      clock_stamp(params, 7);
    }
    Base::prefetch_tma_descriptors(params);
  }

  // The consumers' multiplies and their end, stamped (points 4 and 5) where params.trace is set.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(typename Base::MainloopPipeline pipeline,
                          typename Base::PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx,
                          typename Base::TensorStorage& shared_tensors, Params const& params) {
    if (params_ == nullptr) {
      params_ = &params;
      consumer_stamp(params, 4, thread_idx);
    }
    Base::mma(pipeline, smem_pipe_read, accum, k_tile_count, thread_idx, shared_tensors, params);
  }
  CUTLASS_DEVICE void mma_tail(typename Base::MainloopPipeline pipeline,
                               typename Base::PipelineState smem_pipe_release, int k_tile_count) {
    Base::mma_tail(pipeline, smem_pipe_release, k_tile_count);
    if (params_ != nullptr) consumer_stamp(*params_, 5, threadIdx.x % 128);
  }

 private:
  bool waited_ = false;
  uint32_t tiles_ = 0;
  Params const* params_ = nullptr;  // a consumer's, from its first mma

  // A consumer warpgroup's stamp: point 4 the earliest of the warpgroups', 5 the latest.
  CUTLASS_DEVICE static void consumer_stamp(Params const& params, int point, int thread_idx) {
    if (params.trace == nullptr || thread_idx != 0) return;
    auto* t = reinterpret_cast<unsigned long long*>(trace_slots(params));
    const unsigned long long now = device::globaltimer();
    if (point == 4) {
      if (atomicCAS(t + 4, 0ull, now) == 0ull) clock_stamp(params, 10);
    } else {
      atomicMax(t + 5, now);
    }
  }

  // This CTA's kCutlassTracePoints values in params.trace (set).
  static CUTLASS_DEVICE uint64_t* trace_slots(Params const& params) {
    const uint64_t cta = blockIdx.x + gridDim.x * (blockIdx.y + uint64_t{gridDim.y} * blockIdx.z);
    return params.trace + cta * kCutlassTracePoints;
  }

  // The SM's clock (cycles) at trace point `point` of this CTA (params.trace set).
  static CUTLASS_DEVICE void clock_stamp(Params const& params, int point) {
    trace_slots(params)[point] = clock64();
  }

  // The producer's stamp `point` (and its SM and tile count; at its start, point 0, also its clock,
  // point 9) into params.trace, if set.
  CUTLASS_DEVICE void trace(Params const& params, int point) const {
    if (params.trace == nullptr || threadIdx.x % 32 != 0) return;
    uint64_t* t = trace_slots(params);
    t[point] = device::globaltimer();
    if (point == 0) t[9] = clock64();
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    t[3] = (uint64_t{tiles_} << 32) | sm;
  }

  // Lets the scheduler warp draw the tile after the `tiles`-th (one thread; kClaim only).
  static CUTLASS_DEVICE void signal_claim(Params const& params, uint32_t tiles) {
    if constexpr (kClaim) {
      *reinterpret_cast<volatile uint32_t*>(params.claim_signals + claim_cta()) = tiles;
    }
  }

  // The L2 hint of the weights' TMA loads.
  static CUTLASS_DEVICE cute::TMA::CacheHintSm90 weights_hint(Params const& params) {
    return params.weights_evict_first ? cute::TMA::CacheHintSm90::EVICT_FIRST
                                      : cute::TMA::CacheHintSm90::EVICT_NORMAL;
  }

  // The TMA partitions of the tile's operands, (activations in global memory, their stages,
  // weights in global memory, their stages), for this CTA's slice of each copy (its place in the
  // cluster along the copy's multicast; 0 without a cluster).
  template <class TensorA, class TensorB, class BlockCoord>
  static CUTLASS_DEVICE auto partitions(Params const& params,
                                        cute::tuple<TensorA, TensorB> const& load_inputs,
                                        BlockCoord const& blk_coord,
                                        typename Base::TensorStorage& shared_tensors,
                                        uint32_t slice_a, uint32_t slice_b) {
    using namespace cute;
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    (void)k_coord;
    auto tma_a = params.tma_load_a.get_slice(slice_a);
    auto tma_b = params.tma_load_b.get_slice(slice_b);
    return make_tuple(tma_a.partition_S(get<0>(load_inputs)(_, _, m_coord, _, l_coord)),
                      tma_a.partition_D(make_tensor(make_smem_ptr(shared_tensors.smem_A.data()),
                                                    typename Base::SmemLayoutA{})),
                      tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, l_coord)),
                      tma_b.partition_D(make_tensor(make_smem_ptr(shared_tensors.smem_B.data()),
                                                    typename Base::SmemLayoutB{})));
  }

  // The stock load's loop (each k-tile: acquire the stage, then the TMA loads of both operands,
  // multicast within the cluster where the tile has one), with the weights' loads hinted; with
  // claim_at >= 0, signal_claim(tiles) before the k-tile of that index (or at the end).
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  static CUTLASS_DEVICE void load_tiles(Params const& params,
                                        typename Base::MainloopPipeline pipeline,
                                        typename Base::PipelineState state,
                                        cute::tuple<TensorA, TensorB> const& load_inputs,
                                        BlockCoord const& blk_coord, KTileIterator k_tile_iter,
                                        int k_tile_count, uint32_t block_rank_in_cluster,
                                        typename Base::TensorStorage& shared_tensors, int claim_at,
                                        uint32_t tiles) {
    using namespace cute;
    if (!elect_one_sync()) return;
    using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
    constexpr uint32_t kClusterX = size<0>(ClusterShape{});
    const uint32_t cx = block_rank_in_cluster % kClusterX, cy = block_rank_in_cluster / kClusterX;
    auto [tAgA, tAsA, tBgB, tBsB] =
        partitions(params, load_inputs, blk_coord, shared_tensors, cy, cx);
    // Which CTAs of the cluster each load lands in: A along the cluster's N, B along its M.
    uint16_t mask_a = 0, mask_b = 0;
    auto cluster = Layout<ClusterShape>{};  // (m, n) -> block rank
    if constexpr (std::is_same_v<typename Base::GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
      for (int n = 0; n < size<1>(cluster); ++n) mask_a |= uint16_t(1) << cluster(cx, n, Int<0>{});
    }
    if constexpr (std::is_same_v<typename Base::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      for (int m = 0; m < size<0>(cluster); ++m) mask_b |= uint16_t(1) << cluster(m, cy, Int<0>{});
    }
    const TMA::CacheHintSm90 hint = weights_hint(params);
    const TMA::CacheHintSm90 hint_a = kWeightsA ? hint : TMA::CacheHintSm90::EVICT_NORMAL;
    const TMA::CacheHintSm90 hint_b = kWeightsA ? TMA::CacheHintSm90::EVICT_NORMAL : hint;
    int i = 0;
    for (; k_tile_count > 0; --k_tile_count, ++k_tile_iter, ++state, ++i) {
      if (i == claim_at) signal_claim(params, tiles);
      pipeline.producer_acquire(state);
      auto* bar = pipeline.producer_get_barrier(state);
      const int stage = state.index();
      copy(params.tma_load_a.with(*bar, mask_a, hint_a), tAgA(_, _, _, *k_tile_iter),
           tAsA(_, _, _, stage));
      copy(params.tma_load_b.with(*bar, mask_b, hint_b), tBgB(_, _, _, *k_tile_iter),
           tBsB(_, _, _, stage));
    }
    if (i <= claim_at) signal_claim(params, tiles);  // (no k-tile left to load)
  }

  // One half of the stock load's work for the `count` k-tiles from k_tile_iter, into the stages
  // from `state` on: with `weights`, acquiring each stage (its barrier then expects the whole
  // stage's bytes) and issuing the weights' TMA load; without, issuing the activations' TMA load
  // into the stage acquired before. Tiles without a cluster only (no multicast).
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  static CUTLASS_DEVICE void load_stages(Params const& params,
                                         typename Base::MainloopPipeline pipeline,
                                         typename Base::PipelineState state,
                                         cute::tuple<TensorA, TensorB> const& load_inputs,
                                         BlockCoord const& blk_coord, KTileIterator k_tile_iter,
                                         int count, typename Base::TensorStorage& shared_tensors,
                                         bool weights) {
    using namespace cute;
    static_assert(std::is_same_v<typename Base::GmemTiledCopyA, SM90_TMA_LOAD> &&
                  std::is_same_v<typename Base::GmemTiledCopyB, SM90_TMA_LOAD>);
    if (!elect_one_sync()) return;
    auto [tAgA, tAsA, tBgB, tBsB] =
        partitions(params, load_inputs, blk_coord, shared_tensors, 0, 0);
    const TMA::CacheHintSm90 hint = weights_hint(params);
    for (int i = 0; i < count; ++i, ++state, ++k_tile_iter) {
      if (weights) pipeline.producer_acquire(state);
      auto* bar = pipeline.producer_get_barrier(state);
      const int stage = state.index();
      if (weights == kWeightsA) {  // the A operand
        copy(params.tma_load_a.with(*bar, 0, weights ? hint : TMA::CacheHintSm90::EVICT_NORMAL),
             tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
      } else {
        copy(params.tma_load_b.with(*bar, 0, weights ? hint : TMA::CacheHintSm90::EVICT_NORMAL),
             tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, stage));
      }
    }
  }

  template <class TensorW, class BlockCoord, class KTileIterator>
  static CUTLASS_DEVICE void prefetch_weights(Params const& params, TensorW const& gW_nkl,
                                              BlockCoord const& blk_coord,
                                              KTileIterator k_tile_iter, int k_tile_count) {
    const int tiles = min(k_tile_count, params.weight_prefetch_bytes / kWeightTileBytes);
    if (tiles <= 0 || !cute::elect_one_sync()) return;
    auto tWgW =
        weight_tile(params, gW_nkl, cute::get<kChannelDim>(blk_coord), cute::get<3>(blk_coord));
    for (int i = 0; i < tiles; ++i, ++k_tile_iter) {
      cute::prefetch(weights_tma(params), tWgW(cute::_, cute::_, cute::_, *k_tile_iter));
    }
  }

  // With tail_prefetch_bytes: where the channel tiles outnumber the grid's CTAs, the CTAs that own
  // no tile of the last, partial wave (they have one tile fewer to stream, so issuing prefetches
  // costs them slack) prefetch the first k-tiles of that wave's tiles (tail_prefetch_bytes shared
  // among those tiles) into L2, k-tile by k-tile across the tiles, in turns. The persistent
  // scheduler hands the CTA of linear index c the tiles c, c + grid, ... (FusedGemm passes the
  // bytes only for calls of one token block and tiles without a cluster: then the grid is
  // one-dimensional and tile i is channel block i).
  template <class TensorW>
  static CUTLASS_DEVICE void prefetch_tail(Params const& params, TensorW const& gW_nkl, int l) {
    if (params.tail_prefetch_bytes <= 0) return;
    const int tiles = static_cast<int>(cute::size<2>(gW_nkl));
    const int k_tiles = static_cast<int>(cute::size<3>(gW_nkl));
    const int grid = static_cast<int>(gridDim.x * gridDim.y * gridDim.z);
    const int cta = static_cast<int>(blockIdx.x + blockIdx.y * gridDim.x);
    const int tail = tiles % grid, first_tail = tiles / grid * grid;
    if (tiles <= grid || cta < tail) return;
    const int per_tile = min(k_tiles, params.tail_prefetch_bytes / tail / kWeightTileBytes);
    if (per_tile <= 0 || !cute::elect_one_sync()) return;
    const int helpers = grid - tail, units = tail * per_tile;
    for (int u = cta - tail; u < units; u += helpers) {
      auto tWgW = weight_tile(params, gW_nkl, first_tail + u % tail, l);
      cute::prefetch(weights_tma(params), tWgW(cute::_, cute::_, cute::_, u / tail));
    }
  }

  // The TMA source partition of one channel tile's weights, (TMA, TMA_N, TMA_K, k).
  template <class TensorW>
  static CUTLASS_DEVICE auto weight_tile(Params const& params, TensorW const& gW_nkl, int tile,
                                         int l) {
    return weights_tma(params).get_slice(0).partition_S(gW_nkl(cute::_, cute::_, tile, cute::_, l));
  }

  // The weights' TMA load.
  static CUTLASS_DEVICE auto const& weights_tma(Params const& params) {
    if constexpr (kWeightsA) {
      return params.tma_load_a;
    } else {
      return params.tma_load_b;
    }
  }
};

}  // namespace qlinear::gpu::cutlass_sm90
