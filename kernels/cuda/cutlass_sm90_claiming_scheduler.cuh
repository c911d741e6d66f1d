// A tile scheduler for CUTLASS's Hopper ping-pong kernel whose CTAs claim their tiles at run time
// from a counter in global memory, instead of each CTA c taking the tiles c, c + grid, c + 2 grid,
// ... (PersistentTileSchedulerSm90, the scheduler of every other cuda.cutlass_sm90 tile).
//
// Why: where the tiles outnumber the SMs (28672 x 4096 at 16 tokens: 448 tiles of 64 channels on
// 132 SMs), the static deal gives some SMs one tile more than others, chosen before the kernel
// starts, and the SMs do not stream their weights equally fast: the benchmark's --diagnose stamps
// showed the swapped tile's CTAs issuing their last loads 11-23 us after the grid dependency on
// that layer (min / max), a tile taking about 5. Claimed at run time, a tile goes to a CTA that is
// ready for it.
//
// How: the kernel's dynamic-persistent path (IsDynamicPersistent), which CUTLASS drives with the
// cluster launch control hardware of later GPUs, run in software. The producer warpgroup's second
// warp (the "scheduler warp") writes each next tile into a small shared-memory ring
// (ClaimPipeline: a full and an empty barrier per slot), and every role that walks the tiles (the
// mainloop's producer, the scheduler warp, each consumer warpgroup for its own tiles) reads it
// from there in order. A CTA's first tile is its static one (its linear index, as the static
// scheduler), every later one is the grid size plus a ticket from the counter (atomicAdd);
// tickets past the last tile are an invalid tile, which ends the CTA. Exactly as many tickets are
// drawn as there are tiles (each CTA with a first tile draws until one is invalid), so the CTA that
// draws the last ticket sets the counter back to zero: the counter is a workspace of zeros that
// each launch leaves zeroed (the GEMMs that use it follow one another in stream order; the
// scheduler warp draws its first ticket only after the grid dependency wait, so that a kernel
// before a programmatic dependent may zero the workspace too). Without a counter (a null
// workspace) the tickets are the static deal, so the same kernel also runs as the static scheduler
// would.
//
// When a CTA draws: CUTLASS lets the scheduler warp draw the next tile as soon as the producer
// starts loading the current one (the throttle pipeline), a whole tile ahead on these layers. With
// a lead (Arguments::lead > 0) the scheduler warp draws only once the producer is `lead` k-tiles
// from the end of the current tile's loads (a word per CTA in the workspace, which the mainloop
// sets: DependentMainloop with kClaim, and the scheduler warp polls). That measured slower on every
// benchmark layer, so the tiles are served drawing a tile ahead (kClaimLead in
// cutlass_sm90_gemm.cc, with the table).
//
// CUDA only; needs the CUTLASS headers and sm_90a.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/pipeline/pipeline.hpp"
#include "kernels/cuda/cutlass_sm90_device.h"
#include "kernels/cuda/sm90_async_device.cuh"

namespace qlinear::gpu::cutlass_sm90 {

// The tile scheduler tag of the claiming tiles (GemmUniversal's fourth parameter).
struct ClaimingScheduler {};

// The workspace (claim_workspace_bytes, cutlass_sm90_device.h): the counter, then from
// kClaimSignalsOffset one word per CTA (its linear block index) in which the producer counts the
// tiles whose loads it has taken up to the claim point (see above); the scheduler warp draws its
// n-th ticket once that reaches n, and zeroes it after its last. (In global memory: a static
// shared word would move the dynamic shared memory off the alignment the pipeline's buffers need.)
CUTLASS_DEVICE uint32_t claim_cta() { return blockIdx.x + gridDim.x * blockIdx.y; }

// The shared-memory ring that carries the claimed tiles from the scheduler warp to the other
// roles: the interface of CUTLASS's cluster-launch-control pipeline, whose producer here is one
// lane of the scheduler warp (one arrival per slot) and whose consumers arrive one per thread.
template <uint32_t S>
class ClaimPipeline {
 public:
  static constexpr uint32_t Stages = S;
  using PipelineState = cutlass::PipelineState<S>;
  struct SharedStorage {
    cutlass::arch::ClusterBarrier full[S];
    cutlass::arch::ClusterBarrier empty[S];
  };
  enum class ThreadCategory { NonParticipant, Producer, Consumer, ProducerConsumer };
  // As the kernel fills them (transaction bytes and block ids have no use here).
  struct Params {
    uint32_t transaction_bytes = 0;
    ThreadCategory role = ThreadCategory::NonParticipant;
    uint32_t is_leader = 0;
    uint32_t num_consumers = 0;
    uint32_t producer_blockid = 0;
    uint32_t producer_arv_count = 1;
    uint32_t consumer_arv_count = 1;
    int initializing_warp = 0;
  };

  CUTLASS_DEVICE ClaimPipeline(SharedStorage& storage, Params const& params)
      : full_(storage.full), empty_(storage.empty) {
    if (cutlass::canonical_warp_idx_sync() == params.initializing_warp && cute::elect_one_sync()) {
      for (uint32_t i = 0; i < S; ++i) {
        full_[i].init(1);
        empty_[i].init(params.consumer_arv_count);
      }
    }
    cutlass::arch::fence_barrier_init();
  }

  CUTLASS_DEVICE void producer_acquire(PipelineState state) {
    empty_[state.index()].wait(state.phase());
  }
  // One arrival (release) after the slot was written; any lane of the scheduler warp may call it.
  CUTLASS_DEVICE void producer_commit(PipelineState state) {
    if (cutlass::canonical_lane_idx() == 0) full_[state.index()].arrive();
  }
  CUTLASS_DEVICE void producer_tail(PipelineState state) {
    for (uint32_t i = 0; i < S; ++i, ++state) producer_acquire(state);
  }
  CUTLASS_DEVICE void consumer_wait(PipelineState state) {
    full_[state.index()].wait(state.phase());
  }
  CUTLASS_DEVICE void consumer_release(PipelineState state) { empty_[state.index()].arrive(); }

 private:
  cutlass::arch::ClusterBarrier* full_;
  cutlass::arch::ClusterBarrier* empty_;
};

class ClaimingTileScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  static constexpr bool IsDynamicPersistent = true;
  static constexpr uint32_t Stages = 4;

  // One slot: the claimed tile's linear index, -1 for none.
  struct CLCResponse {
    int32_t linear_idx = -1;
    int32_t unused[3] = {};
  };
  using Pipeline = ClaimPipeline<Stages>;
  using PipelineStorage = typename Pipeline::SharedStorage;
  using ThrottlePipeline = cutlass::PipelineAsync<Stages>;
  using ThrottlePipelineStorage = typename ThrottlePipeline::SharedStorage;

  class SharedStorage {
   public:
    CUTLASS_DEVICE PipelineStorage& pipeline() { return pipeline_; }
    CUTLASS_DEVICE ThrottlePipelineStorage& throttle_pipeline() { return throttle_pipeline_; }
    CUTLASS_DEVICE CLCResponse* data() { return data_; }

   private:
    alignas(16) PipelineStorage pipeline_;
    alignas(16) ThrottlePipelineStorage throttle_pipeline_;
    alignas(16) CLCResponse data_[Stages];
  };

  struct Arguments : Base::Arguments {
    int lead =
        0;  // k-tiles before the end of a tile's loads at which the next is drawn; 0: CUTLASS's
  };
  struct Params : Base::Params {
    uint32_t* counter = nullptr;  // null: the static deal
    uint32_t* signals = nullptr;  // per CTA, after the counter
    int lead = 0;
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem_shape_mnkl, TileShape tile_shape,
                                        ClusterShape cluster_shape,
                                        cutlass::KernelHardwareInfo const& hw_info,
                                        Arguments const& args, void* workspace = nullptr,
                                        uint32_t = 1, uint32_t = 1) {
    static_assert(cute::size(ClusterShape{}) == 1, "the claiming scheduler takes tiles of one CTA");
    Params params;
    static_cast<Base::Params&>(params) = Base::to_underlying_arguments(
        problem_shape_mnkl, tile_shape, cluster_shape, hw_info, args, workspace);
    params.counter = static_cast<uint32_t*>(workspace);
    if (workspace != nullptr) {
      params.signals =
          reinterpret_cast<uint32_t*>(static_cast<char*>(workspace) + kClaimSignalsOffset);
    }
    params.lead = args.lead;
    return params;
  }

  template <class ProblemShape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const&, ProblemShape,
                                   cutlass::KernelHardwareInfo const& hw_info, uint32_t,
                                   uint32_t = 1, uint32_t = 1) {
    return claim_workspace_bytes(hw_info.sm_count);
  }

  template <class ProblemShape, class ElementAccumulator>
  static cutlass::Status initialize_workspace(Arguments const&, void* workspace,
                                              cudaStream_t stream, ProblemShape,
                                              cutlass::KernelHardwareInfo const& hw_info, uint32_t,
                                              uint32_t = 1, uint32_t = 1,
                                              cutlass::CudaHostAdapter* = nullptr) {
    if (workspace == nullptr) return cutlass::Status::kSuccess;
    return cudaMemsetAsync(workspace, 0, claim_workspace_bytes(hw_info.sm_count), stream) ==
                   cudaSuccess
               ? cutlass::Status::kSuccess
               : cutlass::Status::kErrorInternal;
  }

  CUTLASS_DEVICE explicit ClaimingTileScheduler(Params const& params)
      : Base(params), counter_(params.counter), signals_(params.signals), lead_(params.lead) {}

  CUTLASS_DEVICE void set_data_ptr(CLCResponse* data) { data_ = data; }

  // The scheduler warp: waits for a free slot, draws the next tile into it (one lane), publishes.
  template <class PipelineState>
  CUTLASS_DEVICE PipelineState advance_to_next_work(Pipeline& pipeline, PipelineState state) {
    pipeline.producer_acquire(state);
    if (cutlass::canonical_lane_idx() == 0) {
      // As a programmatic dependent, the workspace may still be being zeroed by the kernel before.
      if (draws_ == 0) device::grid_dependency_wait();
      ++draws_;
      volatile uint32_t* signal = signals_ != nullptr ? signals_ + claim_cta() : nullptr;
      if (lead_ > 0 && signal != nullptr) {
        while (*signal < draws_) __nanosleep(64);
      }
      const uint64_t grid = uint64_t{gridDim.x} * gridDim.y * gridDim.z;
      const uint64_t tiles = scheduler_params.blocks_per_problem_;
      uint64_t next;
      if (counter_ != nullptr) {
        const uint32_t ticket = atomicAdd(counter_, 1u);
        if (ticket + uint64_t{1} == tiles) atomicExch(counter_, 0u);  // the last draw
        next = grid + ticket;
      } else {
        next = first_linear_idx() + grid * draws_;
      }
      data_[state.index()].linear_idx = next < tiles ? static_cast<int32_t>(next) : -1;
      if (next >= tiles && signal != nullptr) *signal = 0;  // this CTA's last draw
    }
    __syncwarp();
    pipeline.producer_commit(state);
    ++state;
    return state;
  }

  // Every role: the next tile from the ring, in order.
  template <class PipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo, Pipeline& pipeline, PipelineState state) {
    pipeline.consumer_wait(state);
    const int32_t idx = data_[state.index()].linear_idx;
    pipeline.consumer_release(state);
    const WorkTileInfo work = idx < 0 ? WorkTileInfo::invalid_work_tile()
                                      : get_current_work_for_linear_idx(static_cast<uint64_t>(idx));
    return cute::make_tuple(work, true);
  }

  template <class PipelineState>
  CUTLASS_DEVICE void store_invalid_response(PipelineState state) {
    if (cutlass::canonical_lane_idx() == 0) data_[state.index()].linear_idx = -1;
    __syncwarp();
  }

 private:
  // The static scheduler's first tile of this CTA.
  CUTLASS_DEVICE uint64_t first_linear_idx() const {
    return scheduler_params.raster_order_ == RasterOrder::AlongN
               ? uint64_t{blockIdx.x} + uint64_t{blockIdx.y} * gridDim.x
               : uint64_t{blockIdx.x} * gridDim.y + blockIdx.y;
  }

  uint32_t* counter_ = nullptr;
  uint32_t* signals_ = nullptr;
  int lead_ = 0;
  uint32_t draws_ = 0;
  CLCResponse* data_ = nullptr;
};

}  // namespace qlinear::gpu::cutlass_sm90

namespace cutlass::gemm::kernel::detail {

template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<qlinear::gpu::cutlass_sm90::ClaimingScheduler, ArchTag, TileShape,
                             ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = qlinear::gpu::cutlass_sm90::ClaimingTileScheduler;
};

}  // namespace cutlass::gemm::kernel::detail
