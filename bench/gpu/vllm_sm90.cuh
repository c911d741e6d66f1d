// The CUTLASS 3.x GEMM behind the "vLLM" anchor (vllm_sm90.h): one template per configuration,
// each instantiated in a translation unit of its own so that they compile in parallel.
#pragma once

#include <cuda_runtime_api.h>

#include "bench/gpu/vllm_sm90.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/functional.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "kernels/cuda/cutlass_sm90_gemm.cuh"

namespace qlinear::gpu::vllm_sm90 {

// kOurEpilogue: the same GEMM with cuda.cutlass_sm90's epilogue visitor tree in place of vLLM's
// (cutlass_sm90::FusedGemm::Out: the zero-point term azp[m] * adj[n], read where adj is set, and
// the bias in f32), which tells the two epilogues' cost apart from the mainloops'.
template <class TileShape, class ClusterShape, class KernelSchedule, bool kOurEpilogue = false>
struct VllmGemm {
  using ElementD = cutlass::bfloat16_t;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using ScaleA = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float>;  // [m]
  using ScaleB = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float>;  // [n]
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementD, ElementD>;
  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  // sb[n] * f32(acc), then sa[m] * that + bias[n].
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, ScaleB,
      Acc>;
  using VllmOut = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiply_add, ElementD, float, kRound>,
      ScaleA, Scaled, Bias>;
  using Ours =
      cutlass_sm90::FusedGemm<cutlass_sm90::TileConfig<TileShape, ClusterShape, KernelSchedule,
                                                       cutlass::epilogue::TmaWarpSpecialized>,
                              ElementD>;
  using Out = std::conditional_t<kOurEpilogue, typename Ours::Out, VllmOut>;

  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, void,
      cutlass::layout::RowMajor, kAlignD, ElementD, cutlass::layout::RowMajor, kAlignD,
      cutlass::epilogue::TmaWarpSpecialized, Out>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor, 16,
      int8_t, cutlass::layout::ColumnMajor, 16, int32_t, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                      CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const Args& a) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    typename Out::Arguments evt;
    if constexpr (kOurEpilogue) {
      CutlassSm90Args e;
      e.sa = a.sa;
      e.azp = a.azp;
      e.sb = a.sb;
      e.adj = a.adj;
      e.bias_v = a.bias_f;
      evt = Ours::epilogue_arguments(e);
    } else {
      evt = {
          {a.sa},                                       // sa [m]
          {{a.sb}, {}, {}},                             // sb [n] * acc
          {reinterpret_cast<const ElementD*>(a.bias)},  // bias [n]
          {},                                           // multiply_add
      };
    }
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    hw.sm_count = a.sm_count;
    return typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {a.m, a.n, a.k, 1},
        {a.xq, cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(a.m, a.k, 1)), a.w,
         cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(a.n, a.k, 1))},
        {evt, nullptr, cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(a.m, a.n, 1)),
         reinterpret_cast<ElementD*>(a.y),
         cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(a.m, a.n, 1))},
        hw};
  }

  static size_t workspace_bytes(const Args& a) { return Gemm::get_workspace_size(arguments(a)); }

  static cudaError_t run(const Args& a, void* workspace, cudaStream_t stream) {
    Gemm gemm;
    const typename Gemm::Arguments args = arguments(a);
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorNotSupported;
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) {
      return cudaErrorInvalidValue;
    }
    if (gemm.run(stream) != cutlass::Status::kSuccess) {
      const cudaError_t e = cudaGetLastError();
      return e == cudaSuccess ? cudaErrorLaunchFailure : e;
    }
    return cudaSuccess;
  }
};

// The five configurations (vllm_sm90.h), one per translation unit.
using TmaWs = cutlass::gemm::KernelTmaWarpSpecialized;
using PingPong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using M32NSmall = VllmGemm<cute::Shape<cute::_64, cute::_64, cute::_256>,
                           cute::Shape<cute::_1, cute::_8, cute::_1>, TmaWs>;
using M32NBig = VllmGemm<cute::Shape<cute::_64, cute::_128, cute::_256>,
                         cute::Shape<cute::_1, cute::_4, cute::_1>, TmaWs>;
using M64 = VllmGemm<cute::Shape<cute::_64, cute::_64, cute::_256>,
                     cute::Shape<cute::_1, cute::_1, cute::_1>, TmaWs>;
using M128 = VllmGemm<cute::Shape<cute::_64, cute::_128, cute::_128>,
                      cute::Shape<cute::_2, cute::_1, cute::_1>, PingPong>;
using Default = VllmGemm<cute::Shape<cute::_128, cute::_128, cute::_128>,
                         cute::Shape<cute::_2, cute::_1, cute::_1>, PingPong>;
using M128OurEpilogue = VllmGemm<cute::Shape<cute::_64, cute::_128, cute::_128>,
                                 cute::Shape<cute::_2, cute::_1, cute::_1>, PingPong, true>;

// Defines a configuration's entry points (declared in vllm_sm90.h).
#define QLINEAR_VLLM_DEFINE(name, type)                                             \
  size_t workspace_bytes_##name(const Args& a) { return type::workspace_bytes(a); } \
  cudaError_t run_##name(const Args& a, void* workspace, cudaStream_t stream) {     \
    return type::run(a, workspace, stream);                                         \
  }

}  // namespace qlinear::gpu::vllm_sm90
