// The epilogue of the cuda.cutlass_sm90 tiles that split K (TileConfig::kSplitK): the root of
// their epilogue visitor tree, which sums the slices' int32 accumulators and writes y itself.
//
// Why: at a few tokens a layer of 4096 channels holds only 64 tiles of 64 channels, 64 CTAs for
// 132 SMs, and each streams 64 rows of the whole K. Cut into `splits` slices along K (the GEMM's
// batch mode: slice l reads bytes [l * k / splits, (l + 1) * k / splits) of every row), the same
// weights are streamed by `splits` times as many CTAs.
//
// How the slices meet: each element's int32 partial sum goes into its own 64-bit word of
// `partials` ([m][n], zero before the launch) by one atomic add of (1 << 40) + the partial as an
// unsigned 32-bit value. The low 32 bits then hold the wrapping int32 sum of the partials that
// arrived, bits 32-39 their carries, and bits 40 and up how many arrived. The add returns the word
// before it, so the slice whose add brings the count to `splits` holds the element's whole sum: it
// alone applies SPEC section 4 (the same functors, in the same order, as the other tiles' tree in
// cutlass_sm90_gemm.cuh), stores y, and writes the word back to zero. No slice waits for another
// and no flag or fence is needed: the sum travels in the same atomic word as the count. The int32
// sum modulo 2^32 does not depend on the order the slices arrive in, so y is bit-exact.
//
// The collective epilogue runs without its own D (its ElementD is void: no shared memory stages,
// no TMA store); this node's stores are direct, one element per thread and value, predicated by
// the tile's residue. With splits == 1 the node stores every in-bounds element without atomics.
//
// CUDA only; needs the CUTLASS headers and sm_90a.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/numeric_conversion.h"

namespace qlinear::gpu::cutlass_sm90 {

// The arrival count's place in a partials word (above the 32-bit sum and 8 bits of its carries:
// up to 255 slices).
inline constexpr int kSplitCountShift = 40;
inline constexpr int kMaxSplits = 255;

// NodeOp of the tree Sm90EVT<SplitKStore, sa, azp, sb, adj, bias_v>: sa and azp per token, sb,
// adj and bias_v per channel, each a broadcast leaf. The GEMM's M is the channels and its N the
// tokens (the tiles that split K swap their operands).
template <class ElementD>
struct SplitKStore {
  // What the collective sizes its fragments by, its own D being void.
  using ElementAux = ElementD;

  struct SharedStorage {};
  struct Arguments {
    uint64_t* partials = nullptr;  // [m][n], zero before the launch; left zero (splits > 1)
    ElementD* y = nullptr;         // [m][n] row-major
    int splits = 1;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.y != nullptr && args.splits >= 1 && args.splits <= kMaxSplits &&
           (args.splits == 1 || args.partials != nullptr);
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  CUTLASS_HOST_DEVICE SplitKStore() {}
  CUTLASS_HOST_DEVICE SplitKStore(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(
      cutlass::epilogue::fusion::detail::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }

  // tCcD: this thread's coordinates relative to its first element, (CPY, CPY_M, CPY_N, EPI_M,
  // EPI_N), in the order the collective visits its accumulators; residue: how far past its first
  // element the problem extends, so that c is in bounds where elem_less(c, residue).
  template <class CoordTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CoordTensor tCcD, Residue residue, int channel0,
                                          int token0, int channels, Params const& params)
        : tCcD(tCcD),
          residue(residue),
          channel0(channel0),
          token0(token0),
          channels(channels),
          params(params) {}

    CoordTensor tCcD;
    Residue residue;
    int channel0, token0;  // this thread's first element, absolute
    int channels;          // the layer's N: y's row stride
    Params const& params;

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementD, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc, int epi_v, int epi_m,
        int epi_n, cutlass::Array<float, FragmentSize> const& sa,
        cutlass::Array<int32_t, FragmentSize> const& azp,
        cutlass::Array<float, FragmentSize> const& sb,
        cutlass::Array<int32_t, FragmentSize> const& adj,
        cutlass::Array<float, FragmentSize> const& bias_v) {
      static_assert(sizeof(ElementAccumulator) == 4);
      auto c = tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
      int64_t at[FragmentSize];
      bool in[FragmentSize];
      uint32_t sum[FragmentSize];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        const auto crd = c(epi_v * FragmentSize + i);
        in[i] = cute::elem_less(crd, residue);
        at[i] = int64_t{token0 + cute::get<1>(crd)} * channels + channel0 + cute::get<0>(crd);
        sum[i] = static_cast<uint32_t>(frg_acc[i]);
      }
      if (params.splits > 1) {
        // Every add first, so that their round trips overlap; then the last arrivals finish.
        uint64_t now[FragmentSize];
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          const uint64_t add = (uint64_t{1} << kSplitCountShift) | sum[i];
          now[i] = in[i] ? atomicAdd(reinterpret_cast<unsigned long long*>(params.partials + at[i]),
                                     static_cast<unsigned long long>(add)) +
                               add
                         : 0;
        }
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          const bool last = in[i] && (now[i] >> kSplitCountShift) == uint64_t(params.splits);
          if (last) params.partials[at[i]] = 0;
          in[i] = last;
          sum[i] = static_cast<uint32_t>(now[i]);
        }
      }
      // SPEC section 4, as the other tiles' tree computes it (cutlass_sm90_gemm.cuh).
      cutlass::Array<float, FragmentSize> v;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        const uint32_t zp = static_cast<uint32_t>(azp[i]) * static_cast<uint32_t>(adj[i]);
        const float t = static_cast<float>(static_cast<int32_t>(sum[i] - zp));
        v[i] = __fmaf_rn(sa[i], __fmul_rn(sb[i], t), bias_v[i]);
      }
      const cutlass::Array<ElementD, FragmentSize> out =
          cutlass::NumericArrayConverter<ElementD, float, FragmentSize,
                                         cutlass::FloatRoundStyle::round_to_nearest>{}(v);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        if (in[i]) params.y[at[i]] = out[i];
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    const int channel0 = static_cast<int>(M) - static_cast<int>(cute::get<0>(args.residue_tCcD));
    const int token0 = static_cast<int>(N) - static_cast<int>(cute::get<1>(args.residue_tCcD));
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        args.tCcD, args.residue_tCcD, channel0, token0, static_cast<int>(M), params);
  }
};

}  // namespace qlinear::gpu::cutlass_sm90
