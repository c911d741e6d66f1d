// The CUTLASS 3.x kernel behind cuda.cutlass_sm90, as one template per (tile configuration,
// output type); each cutlass_sm90_tile_*.cu instantiates one configuration so that the slow
// CUTLASS compilations run in parallel. See cutlass_sm90_device.h for the computed function.
//
// The epilogue is an epilogue visitor tree whose every node is a functor written here with an
// explicit round-to-nearest intrinsic, so that the SPEC section 4 order holds bit for bit:
//   zp  = azp[m] * adj[n]                       int32, wrapping   (WrapMul)
//   t   = f32(acc - zp)                         int32 wrapping, then one rn conversion (WrapSub)
//   s   = sb[n] * t                             __fmul_rn          (MulRn)
//   y   = out(fma(sa[m], s, bias_v[n]))         __fmaf_rn, then one rne conversion to y's type
// (CUTLASS's own multiply_add is a * b + c, which --fmad=false would round twice.)
//
// CUDA only; needs the CUTLASS headers and sm_90a.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "kernels/cuda/cutlass_sm90_dependent_mainloop.cuh"
#include "kernels/cuda/cutlass_sm90_device.h"
#include "kernels/cuda/cutlass_sm90_quantizing_mainloop.cuh"

namespace qlinear::gpu::cutlass_sm90 {

// --- Epilogue functors: scalar form for CUTLASS's argument detection, array form for the
// --- fragments it visits.

template <class T>
struct WrapMul {
  CUTLASS_DEVICE T operator()(T a, T b) const {
    return static_cast<T>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
  }
};
template <class T, int N>
struct WrapMul<cutlass::Array<T, N>> {
  CUTLASS_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& a,
                                                 cutlass::Array<T, N> const& b) const {
    cutlass::Array<T, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      r[i] = static_cast<T>(static_cast<uint32_t>(a[i]) * static_cast<uint32_t>(b[i]));
    }
    return r;
  }
};

template <class T>
struct WrapSub {
  CUTLASS_DEVICE T operator()(T a, T b) const {
    return static_cast<T>(static_cast<uint32_t>(a) - static_cast<uint32_t>(b));
  }
};
template <class T, int N>
struct WrapSub<cutlass::Array<T, N>> {
  CUTLASS_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& a,
                                                 cutlass::Array<T, N> const& b) const {
    cutlass::Array<T, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      r[i] = static_cast<T>(static_cast<uint32_t>(a[i]) - static_cast<uint32_t>(b[i]));
    }
    return r;
  }
};

template <class T>
struct MulRn {
  CUTLASS_DEVICE T operator()(T a, T b) const { return __fmul_rn(a, b); }
};
template <int N>
struct MulRn<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& a,
                                                     cutlass::Array<float, N> const& b) const {
    cutlass::Array<float, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fmul_rn(a[i], b[i]);
    return r;
  }
};

template <class T>
struct FmaRn {
  CUTLASS_DEVICE T operator()(T a, T b, T c) const { return __fmaf_rn(a, b, c); }
};
template <int N>
struct FmaRn<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& a,
                                                     cutlass::Array<float, N> const& b,
                                                     cutlass::Array<float, N> const& c) const {
    cutlass::Array<float, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fmaf_rn(a[i], b[i], c[i]);
    return r;
  }
};

// --- The kernel ---

// TileShape is (A's rows, B's rows, K) of the GEMM and ClusterShape the same way. Normally A is
// the activations (tokens) and B the weights (channels). With kSwapAB the operands trade places:
// the GEMM computes y's transpose, the weights' channels on the MMA's M side (64 per warpgroup
// instruction, its least) and the tokens on its N side (8 or more), so that a tile for a few
// tokens need not load 64 rows of activations per k-tile (the rows past M are read as whole token
// blocks, see CutlassSm90Args::xq_rows) and its pipeline stages hold mostly weights.
//
// With kClaim the CTAs claim their tiles at run time from a counter instead of taking a static
// share (cutlass_sm90_claiming_scheduler.cuh; tiles without a cluster on the ping-pong schedule).
template <class TileShape_, class ClusterShape_, class KernelSchedule_, class EpilogueSchedule_,
          bool kQuantize_ = false, bool kSwapAB_ = false, bool kClaim_ = false>
struct TileConfig {
  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;
  using KernelSchedule = KernelSchedule_;
  using EpilogueSchedule = EpilogueSchedule_;
  // The activations are quantized inside the launch (cutlass_sm90_quantizing_mainloop.cuh).
  static constexpr bool kQuantize = kQuantize_;
  static constexpr bool kSwapAB = kSwapAB_;
  static constexpr bool kClaim = kClaim_;
  static_assert(!(kQuantize && kSwapAB), "a quantizing tile keeps the activations as A");
  static_assert(
      !kClaim || (cute::size(ClusterShape{}) == 1 &&
                  std::is_same_v<KernelSchedule, cutlass::gemm::KernelTmaWarpSpecializedPingpong> &&
                  !kQuantize),
      "the claiming scheduler takes ping-pong tiles of one CTA");
  // The tile's and the cluster's extents along the tokens and along the channels.
  static constexpr int kTokenDim = kSwapAB ? 1 : 0;
  static constexpr int kChannelDim = kSwapAB ? 0 : 1;
};

// Shared memory per block on sm_90 (227 KB), and what a claiming tile's stage count leaves for the
// scheduler's ring.
inline constexpr int kSm90MaxSmem = 232448;
inline constexpr int kClaimExtraSmem = 1024;

template <class Config, class ElementD>
struct FusedGemm {
  using TileShape = typename Config::TileShape;
  using ClusterShape = typename Config::ClusterShape;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  template <class E>
  using RowVec = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, E, E>;  // GEMM's N
  template <class E>
  using ColVec = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, E, E>;  // GEMM's M
  // Per token ([m]: sa, azp) and per channel ([n]: sb, adj, bias_v).
  template <class E>
  using TokenVec = std::conditional_t<Config::kSwapAB, RowVec<E>, ColVec<E>>;
  template <class E>
  using ChannelVec = std::conditional_t<Config::kSwapAB, ColVec<E>, RowVec<E>>;
  template <template <class> class Fn, class Out, class In>
  using Compute = cutlass::epilogue::fusion::Sm90Compute<Fn, Out, In, kRound>;
  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  template <class... Ts>
  using EVT = cutlass::epilogue::fusion::Sm90EVT<Ts...>;

  using ZpTerm = EVT<Compute<WrapMul, int32_t, int32_t>, TokenVec<int32_t>, ChannelVec<int32_t>>;
  using T = EVT<Compute<WrapSub, float, int32_t>, Acc, ZpTerm>;
  using Scaled = EVT<Compute<MulRn, float, float>, ChannelVec<float>, T>;
  using Out = EVT<Compute<FmaRn, ElementD, float>, TokenVec<float>, Scaled, ChannelVec<float>>;

  static constexpr int kAlignD = 16 / sizeof(ElementD);
  // y [m, n] row-major; swapped, the GEMM's D is its transpose, [n, m] column-major.
  using LayoutD =
      std::conditional_t<Config::kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, void, LayoutD, kAlignD,
      ElementD, LayoutD, kAlignD, typename Config::EpilogueSchedule, Out>::CollectiveOp;
  using StockMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor, 16,
      int8_t, cutlass::layout::ColumnMajor, 16, int32_t, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage)) +
          (Config::kQuantize ? kAuxExtraSmem : 0) + (Config::kClaim ? kClaimExtraSmem : 0)>,
      typename Config::KernelSchedule>::CollectiveOp;
  using CollectiveMainloop =
      std::conditional_t<Config::kQuantize, QuantizingMainloop<DependentMainloop<StockMainloop>>,
                         DependentMainloop<StockMainloop, Config::kSwapAB, Config::kClaim>>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue,
      std::conditional_t<Config::kClaim, ClaimingScheduler, cutlass::gemm::PersistentScheduler>>;
  static_assert(Kernel::SharedStorageSize <= kSm90MaxSmem, "the kernel's shared memory");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // The epilogue's operands (sa, azp, sb, adj, bias_v of `a`).
  static typename Out::Arguments epilogue_arguments(const CutlassSm90Args& a) {
    return {
        {a.sa},  // sa [m]
        {
            {a.sb},  // sb [n]
            {
                {},  // acc
                // azp[m] * adj[n]; without adj (symmetric schemes) 0, read from neither
                {{a.adj != nullptr ? a.azp : nullptr}, {a.adj}, {}},
                {},  // acc - that, to f32
            },
            {},  // sb * t
        },
        {a.bias_v},  // bias_v [n]
        {},          // fma
    };
  }

  // (workspace: the launch's, where a claiming tile's producer signals; null elsewhere.)
  static typename Gemm::Arguments arguments(const CutlassSm90Args& a, void* workspace = nullptr) {
    const int m = static_cast<int>(a.m), n = static_cast<int>(a.n), k = static_cast<int>(a.k);
    // The GEMM's own M and N (swapped: channels, then tokens).
    const int gm = Config::kSwapAB ? n : m, gn = Config::kSwapAB ? m : n;
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    hw.sm_count = a.sm_count;
    const int8_t* ptr_a = Config::kSwapAB ? a.w : a.xq;
    const int8_t* ptr_b = Config::kSwapAB ? a.xq : a.w;
    typename StockMainloop::Arguments mainloop{
        ptr_a, cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(gm, k, 1)), ptr_b,
        cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(gn, k, 1))};
    using Raster = typename Kernel::TileScheduler::RasterOrderOptions;
    typename Kernel::TileScheduler::Arguments scheduler;
    scheduler.max_swizzle_size = a.swizzle < 1 ? 1 : a.swizzle;
    scheduler.raster_order = Config::kQuantize || a.raster == 2 ? Raster::AlongN
                             : a.raster == 1                    ? Raster::AlongM
                                                                : Raster::Heuristic;
    if constexpr (Config::kClaim) scheduler.lead = a.claim_lead;
    return typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {gm, gn, k, 1},
        mainloop_arguments(a, mainloop, workspace),
        {epilogue_arguments(a), nullptr,
         cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(gm, gn, 1)),
         static_cast<ElementD*>(a.y),
         cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(gm, gn, 1))},
        hw,
        scheduler};
  }

  // Tokens and channels per tile, and CTAs per cluster along the tokens.
  static constexpr int kBlockM = cute::size<Config::kTokenDim>(TileShape{});
  static constexpr int kBlockN = cute::size<Config::kChannelDim>(TileShape{});
  static constexpr int kClusterM = cute::size<Config::kTokenDim>(ClusterShape{});

  // The rows quantized before the GEMM: enough for the tiles of its first two waves (the
  // scheduler walks along N, so a wave covers about clusters / tiles_n cluster rows of m-blocks)
  // and one more cluster row per swizzle step, as a whole number of m-blocks.
  // (The launch sets it to 0 where the GEMM's set-up quantizes every row: prologue_unit_rows.)
  static int64_t quantized_prefix(const CutlassSm90Args& a) {
    // At least one row: the quantize kernel launched first also zeroes the counters.
    if (a.prefix >= 0) return a.prefix < 1 ? 1 : a.prefix < a.m ? a.prefix : a.m;
    const int64_t clusters = a.sm_count / kClusterM;
    const int64_t tiles_n = (a.n + kBlockN - 1) / kBlockN;
    const int64_t cluster_rows = kBlockM * kClusterM;
    const int64_t swizzle = a.swizzle < 1 ? 1 : a.swizzle;
    const int64_t rows =
        (2 * clusters + tiles_n - 1) / tiles_n * cluster_rows + swizzle * cluster_rows;
    const int64_t blocks = (rows + kBlockM - 1) / kBlockM * kBlockM;
    return blocks < a.m ? blocks : a.m;
  }

  static QuantizeInGemm quantize_in_gemm(const CutlassSm90Args& a) {
    QuantizeInGemm q;
    q.x = a.x;
    q.x_type = a.x_type;
    q.qp = a.qp;
    q.xq = const_cast<int8_t*>(a.xq);
    q.sa = const_cast<float*>(a.sa);
    q.azp = const_cast<int32_t*>(a.azp);
    q.counters = a.counters;
    q.m = static_cast<int>(a.m);
    q.k = static_cast<int>(a.k);
    q.prefix = static_cast<int>(quantized_prefix(a));
    return q;
  }

  // The stages whose weights a dependent launch issues before its wait: every stage the pipeline
  // holds, or CutlassSm90Args::weights_ahead_stages where fewer.
  static int ahead_stages(const CutlassSm90Args& a) {
    constexpr int kStages = StockMainloop::DispatchPolicy::Stages;
    return a.weights_ahead_stages > 0 && a.weights_ahead_stages < kStages ? a.weights_ahead_stages
                                                                          : kStages;
  }

  // CutlassSm90Args::tail_prefetch_bytes where it applies (the mainloop finds the last wave, if
  // any): calls of one token block on tiles without a cluster; 0 elsewhere.
  static int tail_prefetch_bytes(const CutlassSm90Args& a) {
    if (a.tail_prefetch_bytes <= 0 || cute::size(ClusterShape{}) != 1 || a.m > kBlockM ||
        Config::kQuantize) {
      return 0;
    }
    return static_cast<int>(
        std::min<int64_t>(a.tail_prefetch_bytes, std::numeric_limits<int>::max()));
  }

  static typename CollectiveMainloop::Arguments mainloop_arguments(
      const CutlassSm90Args& a, const typename StockMainloop::Arguments& stock, void* workspace) {
    const bool read_once = token_blocks_fit_cluster(a.m, kBlockM, kClusterM);
    typename DependentMainloop<StockMainloop, Config::kSwapAB, Config::kClaim>::Arguments dependent{
        stock,
        a.pdl ? static_cast<int>(a.weight_prefetch_bytes) : 0,
        a.trace,
        a.pdl && a.weights_ahead && !Config::kQuantize ? ahead_stages(a) : 0,
        a.weights_evict_first && read_once && !Config::kQuantize,
        Config::kQuantize || a.xq_rows > std::numeric_limits<int>::max()
            ? 0
            : static_cast<int>(a.xq_rows),
        tail_prefetch_bytes(a),
        Config::kClaim ? a.claim_lead : 0,
        Config::kClaim && workspace != nullptr
            ? reinterpret_cast<uint32_t*>(static_cast<char*>(workspace) + kClaimSignalsOffset)
            : nullptr};
    if constexpr (Config::kQuantize) {
      return typename CollectiveMainloop::Arguments{dependent, quantize_in_gemm(a)};
    } else {
      return dependent;
    }
  }

  static cudaError_t prepare() {
    static const cudaError_t result = [] {
      const int smem = static_cast<int>(Kernel::SharedStorageSize);
      if (smem < (48 << 10)) return cudaSuccess;
      return cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    }();
    return result;
  }

  static size_t workspace_bytes(const CutlassSm90Args& a) {
    return Gemm::get_workspace_size(arguments(a));
  }

  // The CTAs of the persistent grid for a's problem (the prefix does not change it).
  static int grid_ctas(const CutlassSm90Args& a) {
    CutlassSm90Args b = a;
    b.prefix = 1;
    const typename Kernel::Params params = Kernel::to_underlying_arguments(arguments(b), nullptr);
    const dim3 grid = Kernel::get_grid_shape(params);
    return static_cast<int>(grid.x * grid.y * grid.z);
  }

  // Rows per unit of the set-up's quantization (cutlass_sm90_quantizing_mainloop.cuh) for a on a
  // grid of `ctas` CTAs, or 0 where it does not apply: a prefix other than 0, tiles past the first
  // wave, or more rows per unit than kPrologueUnitRows allows or than the threads hold.
  static int prologue_unit_rows(const CutlassSm90Args& a, int ctas) {
    if constexpr (Config::kQuantize) {
      if (a.prefix != 0 || ctas < 1 || a.m < 1 || a.k % 8 != 0) return 0;
      const int64_t blocks_m = (a.m + kBlockM - 1) / kBlockM;
      const int64_t tiles =
          (blocks_m + kClusterM - 1) / kClusterM * kClusterM * ((a.n + kBlockN - 1) / kBlockN);
      if (tiles > ctas) return 0;
      const int64_t need = (a.m + ctas - 1) / ctas;
      for (int rows : kPrologueUnitRows) {
        const int64_t threads = kPrologueThreads / rows;
        if (rows >= need && (a.k / 8 + threads - 1) / threads <= kPrologueVecs) return rows;
      }
    }
    (void)a, (void)ctas;
    return 0;
  }

  // Where the ring lies in the kernel's shared memory (the set-up's scratch).
  static int ring_offset() {
    if constexpr (Config::kQuantize) {
      static const int offset = [] {
        using Storage = typename Kernel::SharedStorage;
        // Member addresses only, in a buffer that holds no constructed object (strictly outside
        // the language's rules, as offsetof on such a type would be); nothing is read.
        auto buf = std::make_unique<unsigned char[]>(sizeof(Storage) + alignof(Storage));
        const uintptr_t base = (reinterpret_cast<uintptr_t>(buf.get()) + alignof(Storage) - 1) /
                               alignof(Storage) * alignof(Storage);
        const Storage* ss = reinterpret_cast<const Storage*>(base);
        return static_cast<int>(reinterpret_cast<uintptr_t>(&ss->tensors.mainloop.ring) - base);
      }();
      return offset;
    } else {
      return 0;
    }
  }

  // A quantizing tile's conditions on the activations themselves (see CutlassSm90Args).
  static bool activations_ok(const CutlassSm90Args& a) {
    if constexpr (Config::kQuantize) {
      return a.x != nullptr && a.counters != nullptr && a.x_type != ElemType::kF32 &&
             reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
             a.m <= std::numeric_limits<int32_t>::max();
    } else {
      (void)a;
      return true;
    }
  }

  // A quantizing tile's own conditions on the activations: those, and rows that fit the ring or
  // every row quantized in the GEMM's set-up (launch finds the latter from its own grid).
  static bool takes_activations(const CutlassSm90Args& a) {
    if (!activations_ok(a)) return false;
    if constexpr (Config::kQuantize) {
      if (a.prefix != 0 && a.k * 2 <= kAuxRingBytes) return true;
      return prologue_unit_rows(a, grid_ctas(a)) > 0;
    }
    return true;
  }

  static bool can_implement(const CutlassSm90Args& a) {
    return takes_activations(a) && Gemm::can_implement(arguments(a)) == cutlass::Status::kSuccess;
  }

  static cudaError_t launch(const CutlassSm90Args& a, void* workspace, cudaStream_t stream) {
    cudaError_t e = prepare();
    if (e != cudaSuccess) return e;
    if (!activations_ok(a)) return cudaErrorInvalidValue;
    const typename Gemm::Arguments args = arguments(a, workspace);
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    bool pdl = a.pdl;
    // Params straight from the arguments (TMA descriptors encoded on the host) and the static
    // launcher: no per-call attribute setting, no workspace initialisation kernel (the
    // persistent data-parallel scheduler needs none).
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
    if constexpr (Config::kQuantize) {
      static_assert(Kernel::MaxThreadsPerBlock == kPrologueThreads, "the set-up's threads");
      // Every row in the GEMM's set-up where a.prefix is 0, after a kernel that only zeroes the
      // counters; else the prefix rows, and the counters zeroed, by the quantize kernel. The GEMM
      // follows as its programmatic dependent (the producer warps wait on the grid dependency
      // first).
      const dim3 grid = Kernel::get_grid_shape(params);
      const int ctas = static_cast<int>(grid.x * grid.y * grid.z);
      const int rows = prologue_unit_rows(a, ctas);
      QuantizeInGemm& q = params.mainloop.q;
      if (rows > 0) {
        const int units = static_cast<int>((a.m + rows - 1) / rows);
        q.prefix = 0;
        q.unit_rows = rows;
        q.owned_units = units < ctas ? units : ctas;
        if (a.prologue_owned_units >= 0 && a.prologue_owned_units < q.owned_units) {
          q.owned_units = static_cast<int>(a.prologue_owned_units);
        }
        q.scratch_offset = ring_offset();
        e = launch_zero_for_dependent(a.counters, quantizing_tile_counters(a.m), stream);
      } else if (a.prefix == 0 || a.k * 2 > kAuxRingBytes) {
        return cudaErrorInvalidValue;
      } else {
        e = launch_quantize_s8(a.x, a.x_type, q.prefix, a.k, a.qp, q.xq, q.sa, q.azp, stream,
                               a.counters, 1 + (a.m + kBlockM - 1) / kBlockM);
      }
      if (e != cudaSuccess) return e;
      pdl = true;
    }
    if (Gemm::run(params, stream, nullptr, pdl) != cutlass::Status::kSuccess) {
      e = cudaGetLastError();
      return e != cudaSuccess ? e : cudaErrorLaunchFailure;
    }
    return cudaGetLastError();
  }
};

// TileOps::name of a configuration: tile (tokens x channels x K), schedule, whether it quantizes
// inside its launch, and its cluster when it has one.
template <class Config>
const char* tile_name() {
  static const std::string name = [] {
    using T = typename Config::TileShape;
    using C = typename Config::ClusterShape;
    using Schedule = typename Config::KernelSchedule;
    static_assert(std::is_same_v<Schedule, cutlass::gemm::KernelTmaWarpSpecializedPingpong> ||
                  std::is_same_v<Schedule, cutlass::gemm::KernelTmaWarpSpecializedCooperative>);
    std::string s = std::to_string(cute::size<Config::kTokenDim>(T{})) + "x" +
                    std::to_string(cute::size<Config::kChannelDim>(T{})) + "x" +
                    std::to_string(cute::size<2>(T{}));
    s += std::is_same_v<Schedule, cutlass::gemm::KernelTmaWarpSpecializedPingpong> ? " pingpong"
                                                                                   : " cooperative";
    if (Config::kQuantize) s += " quantizing";
    if (Config::kSwapAB) s += ", operands swapped";
    if (Config::kClaim) s += ", tiles claimed at run time";
    if (cute::size(C{}) > 1) {
      s += ", " + std::to_string(cute::size<Config::kTokenDim>(C{})) + "x" +
           std::to_string(cute::size<Config::kChannelDim>(C{})) + " cluster";
    }
    return s;
  }();
  return name.c_str();
}

template <class Config, class ElementD>
constexpr TileOps tile_ops() {
  using G = FusedGemm<Config, ElementD>;
  return TileOps{&G::prepare,
                 &G::workspace_bytes,
                 &G::can_implement,
                 &G::launch,
                 static_cast<int>(cute::size(typename Config::ClusterShape{})),
                 static_cast<int>(cute::size<Config::kTokenDim>(typename Config::TileShape{})),
                 static_cast<int>(cute::size<Config::kChannelDim>(typename Config::TileShape{})),
                 Config::kSwapAB,
                 &tile_name<Config>};
}

// The table of one configuration, for each output type.
template <class Config>
const TileOps* tile_ops_for(ElemType y) {
  static constexpr TileOps kBf16 = tile_ops<Config, cutlass::bfloat16_t>();
  static constexpr TileOps kF16 = tile_ops<Config, cutlass::half_t>();
  static constexpr TileOps kF32 = tile_ops<Config, float>();
  switch (y) {
    case ElemType::kBF16:
      return &kBf16;
    case ElemType::kF16:
      return &kF16;
    case ElemType::kF32:
      return &kF32;
  }
  return nullptr;
}

}  // namespace qlinear::gpu::cutlass_sm90
