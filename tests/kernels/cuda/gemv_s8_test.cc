// The fused CUDA kernels (cuda.gemv_s8, cuda.stream_s8 and cuda.cutlass_sm90) against the
// reference, bit for bit on xq, sa, azp, acc and y: every scheme, x dtype, y dtype and bias, M
// = 1..67 (each kernel within its M range, declining the rest with the reason), a Llama-sized
// shape, awkward rows (all zero, constant, one-hot, tiny, huge), non-finite rows, concurrent
// requests, and unaligned shapes declined and served by another kernel. cuda.gemv_s8 also runs
// every one of its launch plans. Without a usable GPU (or without the CUTLASS kernel compiled in)
// these tests skip with the reason.
#include "kernels/cuda/gemv_s8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "kernels/cuda/cutlass_sm90_gemm.h"
#include "kernels/cuda/gemv_s8_device.h"
#include "kernels/cuda/stream_s8.h"
#include "kernels/registry.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace qlinear::gpu::testing {
namespace {

struct FusedCase {
  const char* name;
  std::function<std::unique_ptr<Kernel>()> make;
  std::vector<int64_t> model_ms;  // M values run on the 4096 x 4096 layer
};

std::string case_name(const ::testing::TestParamInfo<FusedCase>& info) {
  std::string s = info.param.name;
  std::replace(s.begin(), s.end(), '.', '_');
  return s;
}

class FusedKernelTest : public ::testing::TestWithParam<FusedCase> {
 protected:
  void SetUp() override {
    QLINEAR_REQUIRE_GPU();
    kernel_ = GetParam().make();
    const absl::Status s = kernel_->is_supported(host_info());
    if (!s.ok()) GTEST_SKIP() << GetParam().name << " cannot run here: " << s.message();
  }
  // Whether the kernel takes M rows of this layer (each has an M range or output types it
  // leaves to others); a decline must be FAILED_PRECONDITION with a reason.
  bool takes(const LayerConfig& c, int64_t m, DType xt, DType yt) const {
    const absl::Status s = kernel_->can_implement(c, ProblemShape{m, c.n, c.k, xt, yt});
    if (s.ok()) return true;
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    return false;
  }
  std::unique_ptr<Kernel> kernel_;
};

// Every scheme x x-dtype x y-dtype x bias, M = 1..67, on a random aligned shape per combination.
TEST_P(FusedKernelTest, MatchesReferenceForEveryCombinationAndSmallM) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  for (Scheme scheme : kSchemes) {
    for (DType xt : kDTypes) {
      for (DType yt : kDTypes) {
        for (bool bias : {false, true}) {
          const int64_t n = 16 * rng.range(1, 12), k = 16 * rng.range(1, 12);
          const Prepared p = prepare(*kernel_, make_layer(rng, scheme, n, k, bias));
          if (p.kernel == nullptr) return;
          for (int64_t m = 1; m <= 67; ++m) {
            if (!takes(p.weights->config, m, xt, yt)) continue;
            if (!check_call(p, make_x(rng, m, k, xt), xt, m, yt)) break;
          }
        }
      }
    }
  }
}

// A Llama-sized projection (split-K over clusters, several tiles per cluster, all M groups).
TEST_P(FusedKernelTest, MatchesReferenceOnModelShape) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  for (Scheme scheme : {Scheme::kDynamicSymmetric, Scheme::kDynamicAsymmetric}) {
    const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 4096, 4096, true));
    if (p.kernel == nullptr) return;
    for (int64_t m : GetParam().model_ms) {
      EXPECT_TRUE(check_call(p, make_x(rng, m, 4096, DType::kBF16), DType::kBF16, m, DType::kBF16));
    }
  }
}

// NaN or +-Inf anywhere in a row is INVALID_ARGUMENT naming the first bad row, with the
// reference's exact message; y is left untouched. Short rows, and rows long enough that the
// quantize kernel splits each among several blocks (a bad value in the last block's slice too).
TEST_P(FusedKernelTest, RejectsNonFiniteRowsLikeTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Bad {
    int64_t row, col;
    float v;
  };
  for (int64_t k : {int64_t{64}, int64_t{8208}}) {
    const std::vector<std::vector<Bad>> plans = {{{5, 3, nan}, {9, 0, inf}},
                                                 {{0, 63, -inf}},
                                                 {{11, 17, inf}, {11, 18, nan}},
                                                 {{7, 0, nan}},
                                                 {{4, k - 1, nan}, {10, k / 2, -inf}}};
    for (Scheme scheme : kSchemes) {
      const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 16, k, true));
      if (p.kernel == nullptr) return;
      for (DType xt : kDTypes) {
        for (const auto& plan : plans) {
          std::vector<uint8_t> x = make_x(rng, 12, k, xt);
          for (const Bad& b : plan) store_from_f32(x.data(), xt, b.row * k + b.col, b.v);
          const Expected want = reference_run(*p.weights, x.data(), xt, 12, DType::kBF16);
          ASSERT_EQ(want.status.code(), absl::StatusCode::kInvalidArgument);
          std::vector<uint16_t> y(12 * 16, 0xBEEF);
          RunArgs args;
          args.x = x.data();
          args.x_dtype = xt;
          args.m = 12;
          args.y = y.data();
          args.y_dtype = DType::kBF16;
          const absl::Status st = p.kernel->run(args, nullptr);
          EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st << " K=" << k;
          EXPECT_EQ(st.message(), want.status.message()) << "K=" << k;
          EXPECT_EQ(y, std::vector<uint16_t>(12 * 16, 0xBEEF)) << "y was written on error";
        }
      }
    }
  }
}

// The serving entry point (`run`): y, sa and azp in the caller's buffers, timings filled.
TEST_P(FusedKernelTest, RunFillsOutputsAndTimings) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  for (Scheme scheme : kSchemes) {
    const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 64, 128, true));
    if (p.kernel == nullptr) return;
    int64_t m = rng.range(1, 300);
    while (!takes(p.weights->config, m, DType::kBF16, DType::kBF16)) m = rng.range(1, 64);
    const std::vector<uint8_t> x = make_x(rng, m, 128, DType::kBF16);
    const Expected want = reference_run(*p.weights, x.data(), DType::kBF16, m, DType::kBF16);
    std::vector<uint8_t> y(static_cast<size_t>(m * 64 * 2));
    std::vector<float> sa(static_cast<size_t>(m), -1.f);
    std::vector<int32_t> azp(static_cast<size_t>(m), -7);
    RunArgs args;
    args.x = x.data();
    args.x_dtype = DType::kBF16;
    args.m = m;
    args.y = y.data();
    args.y_dtype = DType::kBF16;
    args.sa = sa.data();
    args.azp = is_asymmetric(scheme) ? azp.data() : nullptr;
    RunTimings t;
    ASSERT_TRUE(p.kernel->run(args, &t).ok());
    EXPECT_EQ(first_y_mismatch(want.y, y, DType::kBF16), -1) << scheme_name(scheme);
    EXPECT_EQ(first_mismatch(want.sa, sa), -1) << scheme_name(scheme);
    if (is_asymmetric(scheme)) {
      EXPECT_EQ(first_mismatch(want.azp, azp), -1) << scheme_name(scheme);
    }
    EXPECT_GE(t.quantize_ns, 0);
    EXPECT_GT(t.gemm_ns, 0);
    EXPECT_GT(t.copy_ns, 0);
    EXPECT_EQ(p.kernel->device(), "cuda:0");
    EXPECT_GE(p.kernel->extra_bytes(), 64 * 128);
  }
}

// Small calls replayed from the serving path's CUDA graphs stay exact (check_replayed_calls).
TEST_P(FusedKernelTest, ReplayedSmallCallsMatchTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  check_replayed_calls(*kernel_, rng, [&](const LayerConfig& c, int64_t m, DType xt, DType yt) {
    return takes(c, m, xt, yt);
  });
}

// Small calls with their outputs written straight to the host and copied back stay exact
// (check_outputs_both_ways).
TEST_P(FusedKernelTest, OutputsWrittenToTheHostOrCopiedBackMatchTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  check_outputs_both_ways(*kernel_, rng, [&](const LayerConfig& c, int64_t m, DType xt, DType yt) {
    return takes(c, m, xt, yt);
  });
}

// Requests on one layer from many threads at once share the stream pool; each must get its own
// answer.
TEST_P(FusedKernelTest, ConcurrentRequestsGetTheirOwnResults) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const Prepared p = prepare(*kernel_, make_layer(rng, Scheme::kDynamicAsymmetric, 96, 192, true));
  if (p.kernel == nullptr) return;
  constexpr int kThreads = 8, kCalls = 12;
  struct Job {
    int64_t m;
    std::vector<uint8_t> x;
    Expected want;
  };
  std::vector<std::vector<Job>> jobs(kThreads);
  for (auto& list : jobs) {
    for (int i = 0; i < kCalls; ++i) {
      Job j;
      do {  // within the kernel's M range
        j.m = rng.range(1, 64);
      } while (!kernel_
                    ->can_implement(p.weights->config,
                                    ProblemShape{j.m, 96, 192, DType::kF16, DType::kF32})
                    .ok());
      j.x = make_x(rng, j.m, 192, DType::kF16);
      j.want = reference_run(*p.weights, j.x.data(), DType::kF16, j.m, DType::kF32);
      list.push_back(std::move(j));
    }
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (const Job& j : jobs[t]) {
        std::vector<uint8_t> y(static_cast<size_t>(j.m * 96 * 4));
        RunArgs args;
        args.x = j.x.data();
        args.x_dtype = DType::kF16;
        args.m = j.m;
        args.y = y.data();
        args.y_dtype = DType::kF32;
        if (!p.kernel->run(args, nullptr).ok() || first_y_mismatch(j.want.y, y, DType::kF32) >= 0) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// K or N not a multiple of 16: the kernel declines with the reason, and the registry hands the
// layer to cuda.cublaslt (K, N % 4 == 0) or to a CPU kernel.
TEST_P(FusedKernelTest, UnalignedShapesGoToAnotherKernel) {
  Registry registry;
  ASSERT_EQ(register_builtin_kernels(&registry), absl::OkStatus());
  struct Case {
    int64_t n, k;
    const char* reason;
    const char* taker_prefix;
  };
  for (const Case& s : {Case{64, 100, "K=100 is not a multiple of 16", "cuda.cublaslt"},
                        Case{52, 128, "N=52 is not a multiple of 16", "cuda.cublaslt"},
                        Case{64, 102, "K=102 is not a multiple of 16", "cpu."}}) {
    LayerConfig c;
    c.n = s.n;
    c.k = s.k;
    for (int64_t m : {int64_t{1}, int64_t{2048}}) {
      const ProblemShape shape{m, s.n, s.k, DType::kBF16, DType::kBF16};
      const absl::Status st = kernel_->can_implement(c, shape);
      EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_TRUE(absl::StrContains(st.message(), s.reason)) << st.message();
      auto sel = registry.select(host_info(), c, shape, "", m, m);
      ASSERT_TRUE(sel.ok()) << sel.status();
      EXPECT_TRUE(absl::StartsWith(sel->kernel->name(), s.taker_prefix)) << sel->kernel->name();
      // A real run of the layer on whichever kernel took it, against the reference.
      if (m == 1) {
        SplitMix64 rng = test_rng();
        const auto w = make_layer(rng, Scheme::kDynamicSymmetric, s.n, s.k, true);
        ASSERT_NE(w, nullptr);
        auto prepared = sel->kernel->prepare(*w);
        ASSERT_TRUE(prepared.ok()) << prepared.status();
        const std::vector<uint8_t> x = make_x(rng, 3, s.k, DType::kBF16);
        const Expected want = reference_run(*w, x.data(), DType::kBF16, 3, DType::kBF16);
        std::vector<uint8_t> y(static_cast<size_t>(3 * s.n * 2));
        RunArgs args;
        args.x = x.data();
        args.m = 3;
        args.y = y.data();
        ASSERT_TRUE((*prepared)->run(args, nullptr).ok());
        EXPECT_EQ(first_y_mismatch(want.y, y, DType::kBF16), -1) << sel->kernel->name();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fused, FusedKernelTest,
    ::testing::Values(FusedCase{kGemvS8KernelName, make_gemv_s8_kernel, {1, 16, 64}},
                      FusedCase{kStreamS8KernelName, make_stream_s8_kernel, {1, 16, 32}},
                      FusedCase{kCutlassSm90KernelName, make_cutlass_sm90_kernel, {64, 128}}),
    case_name);

// --- cuda.gemv_s8's launch plans, through the device entry point ---------------------------

// Every (row groups, split_k) the planner may choose, on a shape with a partial last 64-byte
// chunk and a partial last tile, for every M group: xq, sa, azp, acc and y against the
// reference.
TEST(GemvS8Plans, EveryPlanMatchesTheReference) {
  QLINEAR_REQUIRE_GPU();
  if (host_info().gpus[0].cc_major < 9) GTEST_SKIP() << "needs compute capability 9.0";
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t n = 1040, k = 1104;  // 65 tiles of 16 rows; K = 17.25 chunks of 64 bytes
  for (Scheme scheme : {Scheme::kDynamicSymmetric, Scheme::kStaticAsymmetric}) {
    const auto w = make_layer(rng, scheme, n, k, true);
    ASSERT_NE(w, nullptr);
    const LayerConfig& c = w->config;
    DeviceBuffer d_w, d_sb, d_bias, d_adj, d_x, d_y, d_sa, d_azp, d_xq, d_acc;
    ASSERT_TRUE(d_w.allocate(w->w.size(), "w").ok());
    ASSERT_TRUE(d_sb.allocate(n * 4, "sb").ok());
    ASSERT_TRUE(d_bias.allocate(n * 4, "bias").ok());
    ASSERT_TRUE(d_adj.allocate(n * 4, "adj").ok());
    ASSERT_EQ(cudaMemcpy(d_w.get(), w->w.data(), w->w.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_sb.get(), w->sb.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_bias.get(), w->bias.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    if (is_asymmetric(scheme)) {
      ASSERT_EQ(cudaMemcpy(d_adj.get(), w->azp_adj.data(), n * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    for (int64_t m : {1, 7, 16, 33, 64}) {
      const std::vector<uint8_t> x = make_x(rng, m, k, DType::kBF16);
      const Expected want = reference_run(*w, x.data(), DType::kBF16, m, DType::kBF16);
      ASSERT_TRUE(want.status.ok());
      ASSERT_TRUE(d_x.reserve(x.size(), "x").ok());
      ASSERT_TRUE(d_y.reserve(m * n * 2, "y").ok());
      ASSERT_TRUE(d_sa.reserve(m * 4, "sa").ok());
      ASSERT_TRUE(d_azp.reserve(m * 4, "azp").ok());
      ASSERT_TRUE(d_xq.reserve(m * k, "xq").ok());
      ASSERT_TRUE(d_acc.reserve(m * n * 4, "acc").ok());
      ASSERT_EQ(cudaMemcpy(d_x.get(), x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
      GemvS8Args a;
      a.x = d_x.get();
      a.m = m;
      a.n = n;
      a.k = k;
      a.quant.scheme = static_cast<QuantScheme>(scheme);
      a.quant.input_scale = c.input_scale;
      a.quant.input_zero_point = c.input_zero_point;
      a.w = d_w.as<int8_t>();
      a.sb = d_sb.as<float>();
      a.azp_adj = is_asymmetric(scheme) ? d_adj.as<int32_t>() : nullptr;
      a.bias = d_bias.as<float>();
      a.y = d_y.get();
      a.sa = d_sa.as<float>();
      a.azp = d_azp.as<int32_t>();
      a.xq = d_xq.as<int8_t>();
      a.acc = d_acc.as<int32_t>();
      int plans = 0;
      for (int rg : {1, 2, 4, 8}) {
        for (int sk = 1; sk <= 8; ++sk) {
          for (int chunks : {2, 4}) {
            GemvS8Plan plan;
            const cudaError_t pe =
                plan_gemv_s8_fixed(n, k, gemv_m_pad(m), 2, rg, sk, &plan, chunks);
            if (pe == cudaErrorNotSupported) continue;
            ASSERT_EQ(pe, cudaSuccess) << cudaGetErrorString(pe);
            ++plans;
            // Poison every output so that an unwritten element shows.
            ASSERT_EQ(cudaMemset(d_y.get(), 0xA5, m * n * 2), cudaSuccess);
            ASSERT_EQ(cudaMemset(d_acc.get(), 0xA5, m * n * 4), cudaSuccess);
            ASSERT_EQ(cudaMemset(d_xq.get(), 0xA5, m * k), cudaSuccess);
            ASSERT_EQ(launch_gemv_s8(a, plan, nullptr), cudaSuccess);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            std::vector<uint8_t> y(m * n * 2);
            std::vector<int32_t> acc(m * n);
            std::vector<int8_t> xq(m * k);
            std::vector<float> sa(m);
            ASSERT_EQ(cudaMemcpy(y.data(), d_y.get(), y.size(), cudaMemcpyDeviceToHost),
                      cudaSuccess);
            ASSERT_EQ(cudaMemcpy(acc.data(), d_acc.get(), acc.size() * 4, cudaMemcpyDeviceToHost),
                      cudaSuccess);
            ASSERT_EQ(cudaMemcpy(xq.data(), d_xq.get(), xq.size(), cudaMemcpyDeviceToHost),
                      cudaSuccess);
            ASSERT_EQ(cudaMemcpy(sa.data(), d_sa.get(), m * 4, cudaMemcpyDeviceToHost),
                      cudaSuccess);
            const std::string what =
                absl::StrCat(scheme_name(scheme), " M=", m, " row_groups=", rg, " split_k=", sk,
                             " chunks=", chunks, " clusters=", plan.clusters);
            EXPECT_EQ(first_mismatch(want.xq, xq), -1) << what;
            EXPECT_EQ(first_mismatch(want.sa, sa), -1) << what;
            const int64_t ai = first_mismatch(want.acc, acc);
            EXPECT_EQ(ai, -1) << what << ": acc row " << ai / n << " col " << ai % n;
            EXPECT_EQ(first_y_mismatch(want.y, y, DType::kBF16), -1) << what;
            if (HasFailure()) return;
          }
        }
      }
      EXPECT_GE(plans, 8) << "M=" << m;
    }
  }
}

// --- What runs without a GPU --------------------------------------------------------------

TEST(GemvS8Kernel, DeclinesWhatItCannotRun) {
  auto k = make_gemv_s8_kernel();
  EXPECT_EQ(k->name(), "cuda.gemv_s8");
  LayerConfig c;
  c.n = 64;
  c.k = 100;
  ProblemShape s{1, 64, 100, DType::kBF16, DType::kBF16};
  EXPECT_EQ(k->can_implement(c, s).message(),
            "K=100 is not a multiple of 16 (16-byte weight loads)");
  c.k = 128;
  c.n = 56;
  s = ProblemShape{1, 56, 128, DType::kBF16, DType::kBF16};
  EXPECT_EQ(k->can_implement(c, s).message(), "N=56 is not a multiple of 16 (16-row mma tiles)");
  c.n = 64;
  s = ProblemShape{64, 64, 128, DType::kF32, DType::kF16};
  EXPECT_TRUE(k->can_implement(c, s).ok());
  s.m = 65;
  EXPECT_EQ(k->can_implement(c, s).message(), "M=65 is outside 1..64 (small-M kernel)");
  // Activations of 17+ rows of K = 28672 do not fit in the shared memory of two blocks per SM;
  // 16 do.
  c.k = 28672;
  s = ProblemShape{16, 64, 28672, DType::kBF16, DType::kBF16};
  EXPECT_TRUE(k->can_implement(c, s).ok());
  s.m = 17;
  EXPECT_EQ(k->can_implement(c, s).message(),
            "M=17 rows of K=28672 quantized activations do not fit in shared memory");
  EXPECT_EQ(k->preferred_m().min, 1);
  EXPECT_LE(k->preferred_m().max, kGemvMaxM);
}

TEST(GemvS8Kernel, IsSupportedNamesWhatIsMissing) {
  auto k = make_gemv_s8_kernel();
  HostInfo h;
  h.cuda_compiled = true;
  h.cuda_error = "cudaErrorNoDevice: no CUDA-capable device is detected";
  EXPECT_EQ(k->is_supported(h).message(),
            "no CUDA device (cudaErrorNoDevice: no CUDA-capable device is detected)");
}

}  // namespace
}  // namespace qlinear::gpu::testing
