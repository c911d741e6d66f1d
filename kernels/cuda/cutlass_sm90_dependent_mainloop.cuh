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
// The wait lives here, not in the kernel: the library is built without CUTLASS's own grid
// dependency control (CUTLASS_ENABLE_GDC_FOR_SM90), which would wait before the mainloop's first
// call. Every read of the quantize kernel's results follows this wait: the producer's TMA loads of
// xq directly, the consumers' epilogue reads of sa and azp through the pipeline's barriers (the
// epilogue has no producer loads), and the quantizing mainloop waits the same way before it
// reads its counters. Without a programmatic launch griddepcontrol.wait returns at once.
//
// CUDA only; needs the CUTLASS headers and sm_90a.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "kernels/cuda/cutlass_sm90_device.h"
#include "kernels/cuda/sm90_async_device.cuh"

namespace qlinear::gpu::cutlass_sm90 {

template <class Base>
struct DependentMainloop : Base {
  using TileShape = typename Base::TileShape;
  // Bytes of weights in one k-tile of a tile (int8: channels x K).
  static constexpr int kWeightTileBytes = cute::size<1>(TileShape{}) * cute::size<2>(TileShape{});
  // The prefetch is issued by each CTA for its own weights; with a cluster the weights would be
  // multicast between CTAs, and these tiles do not prefetch.
  static constexpr bool kCanPrefetch =
      std::is_same_v<typename Base::GmemTiledCopyB, cute::SM90_TMA_LOAD>;

  struct Arguments : Base::Arguments {
    int weight_prefetch_bytes = 0;  // per CTA, before the grid dependency wait; 0: none
    uint64_t* trace = nullptr;      // CutlassSm90Args::trace
  };
  struct Params : Base::Params {
    int weight_prefetch_bytes = 0;
    uint64_t* trace = nullptr;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape,
                                                  Arguments const& args, void* workspace) {
    return Params{Base::to_underlying_arguments(problem_shape, args, workspace),
                  args.weight_prefetch_bytes, args.trace};
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
      if constexpr (kCanPrefetch) {
        prefetch_weights(params, cute::get<1>(load_inputs), blk_coord, k_tile_iter, k_tile_count);
      }
      device::grid_dependency_wait();
      trace(params, 1);
    }
    ++tiles_;
    Base::load(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, k_tile_count,
               thread_idx, block_rank_in_cluster, shared_tensors);
    trace(params, 2);
  }

 private:
  bool waited_ = false;
  uint32_t tiles_ = 0;

  // The producer's stamp `point` (and its SM and tile count) into params.trace, if set.
  CUTLASS_DEVICE void trace(Params const& params, int point) const {
    if (params.trace == nullptr || threadIdx.x % 32 != 0) return;
    const uint64_t cta = blockIdx.x + gridDim.x * (blockIdx.y + uint64_t{gridDim.y} * blockIdx.z);
    uint64_t* t = params.trace + cta * kCutlassTracePoints;
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    t[point] = now;
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    t[3] = (uint64_t{tiles_} << 32) | sm;
  }

  template <class TensorB, class BlockCoord, class KTileIterator>
  static CUTLASS_DEVICE void prefetch_weights(Params const& params, TensorB const& gB_nkl,
                                              BlockCoord const& blk_coord,
                                              KTileIterator k_tile_iter, int k_tile_count) {
    const int tiles = min(k_tile_count, params.weight_prefetch_bytes / kWeightTileBytes);
    if (tiles <= 0 || !cute::elect_one_sync()) return;
    auto gB = gB_nkl(cute::_, cute::_, cute::get<1>(blk_coord), cute::_, cute::get<3>(blk_coord));
    auto tBgB = params.tma_load_b.get_slice(0).partition_S(gB);  // (TMA, TMA_N, TMA_K, k)
    for (int i = 0; i < tiles; ++i, ++k_tile_iter) {
      cute::prefetch(params.tma_load_b, tBgB(cute::_, cute::_, cute::_, *k_tile_iter));
    }
  }
};

}  // namespace qlinear::gpu::cutlass_sm90
