// cuda.cublaslt (and cuda.quantize inside it) against the reference, bit for bit on xq, sa, azp,
// acc and y: every scheme, x dtype, y dtype and bias, M = 1..67 and 1000..4096, model shapes,
// the largest K, awkward rows (all zero, constant, one-hot, tiny, huge), non-finite rows, and
// concurrent requests. Without a usable GPU every test here skips with the reason.
#include "kernels/cuda/cublaslt_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cutlass_sm90_gemm.h"
#include "kernels/cuda/stream_s8.h"
#include "kernels/registry.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace qlinear::gpu::testing {
namespace {

class CublasLtTest : public ::testing::Test {
 protected:
  void SetUp() override { QLINEAR_REQUIRE_GPU(); }
  std::unique_ptr<Kernel> kernel_ = make_cublaslt_kernel();
};

// Every scheme x x-dtype x y-dtype x bias, M = 1..67, on a random aligned shape per combination.
TEST_F(CublasLtTest, MatchesReferenceForEveryCombinationAndSmallM) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  for (Scheme scheme : kSchemes) {
    for (DType xt : kDTypes) {
      for (DType yt : kDTypes) {
        for (bool bias : {false, true}) {
          const int64_t n = 4 * rng.range(1, 40), k = 4 * rng.range(1, 40);
          const Prepared p = prepare(*kernel_, make_layer(rng, scheme, n, k, bias));
          if (p.kernel == nullptr) return;
          for (int64_t m = 1; m <= 67; ++m) {
            if (!check_call(p, make_x(rng, m, k, xt), xt, m, yt)) break;
          }
        }
      }
    }
  }
}

TEST_F(CublasLtTest, MatchesReferenceForLargeM) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t ms[] = {1000, 2048, 4096, 1000 + rng.range(1, 3095)};
  for (Scheme scheme : kSchemes) {
    const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 132, 264, true));
    if (p.kernel == nullptr) return;
    for (int64_t m : ms) {
      EXPECT_TRUE(check_call(p, make_x(rng, m, 264, DType::kBF16), DType::kBF16, m, DType::kBF16));
    }
    const int64_t m = ms[3];
    EXPECT_TRUE(check_call(p, make_x(rng, m, 264, DType::kF32), DType::kF32, m, DType::kF16));
    EXPECT_TRUE(check_call(p, make_x(rng, m, 264, DType::kF16), DType::kF16, m, DType::kF32));
  }
}

// Long rows of 16-bit activations for 17..256 tokens, where the quantize kernel brings each row
// into shared memory (quantize_rows_bulk_s8), and beside it (300 rows; 200 rows of 28672 values,
// over its 8 MB: each row in one block's registers, quantize_rows_regs_s8); from 1024 rows and
// more x than the ring's rule asks (rows of 8192 values or more past 3/4 of the L2, shorter rows
// past twice the L2: 37.5 and 100 MB on the H100 and H200), the rings of rows in shared memory
// (quantize_rows_ring_s8: 4, 3 and 2 slots a warp, each ring of the 528 warps of 132 SMs going
// round more than once; 2 slots of the longest row, 14520 values, fill the block's shared memory
// to the byte) and past their longest row the warp form (16384 values): every scheme, both 16-bit
// types, awkward rows; row 1 constant (dynamic asymmetric: a zero row) and row 2 all zeros.
TEST_F(CublasLtTest, MatchesReferenceOnLongRowsOfManyTokens) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  struct Rows {
    int64_t m, k;
  };
  const Rows sizes[] = {{17, 28672},   {100, 8208},  {256, 4096},
                        {300, 4096},   {200, 28672}, {64, 4096 + 8 * rng.range(1, 3000)},
                        {13000, 4096}, {2500, 8192}, {1900 + rng.range(0, 200), 14336},
                        {1800, 14520}, {1100, 16384}};
  int combo = 0;
  for (Scheme scheme : kSchemes) {
    for (const Rows& r : sizes) {
      const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 16, r.k, combo % 2 == 0));
      if (p.kernel == nullptr) return;
      const DType xt = combo % 2 == 0 ? DType::kBF16 : DType::kF16;
      const DType yt = kDTypes[combo % 3];
      ++combo;
      std::vector<uint8_t> x = make_x(rng, r.m, r.k, xt);
      for (int64_t i = 0; i < r.k; ++i) {
        store_from_f32(x.data(), xt, r.k + i, 0.5f);
        store_from_f32(x.data(), xt, 2 * r.k + i, 0.f);
      }
      EXPECT_TRUE(check_call(p, x, xt, r.m, yt)) << "M=" << r.m << " K=" << r.k;
    }
  }
}

// A Llama-sized projection at decode and small-batch M (the cuBLASLt algorithms differ there:
// split-K and stream-K for the weight-bound sizes).
TEST_F(CublasLtTest, MatchesReferenceOnModelShape) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const Prepared p =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, 4096, 4096, true));
  if (p.kernel == nullptr) return;
  for (int64_t m : {1, 16, 64}) {
    EXPECT_TRUE(
        check_call(p, make_x(rng, m, 4096, DType::kBF16, false), DType::kBF16, m, DType::kBF16));
  }
}

// The largest aligned K whose int32 accumulation is still exact.
TEST_F(CublasLtTest, MatchesReferenceAtLargestK) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t k = kMaxK / 4 * 4;
  for (Scheme scheme : kSchemes) {
    const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 8, k, true));
    if (p.kernel == nullptr) return;
    EXPECT_TRUE(check_call(p, make_x(rng, 3, k, DType::kF32), DType::kF32, 3, DType::kF32));
  }
}

// NaN or +-Inf anywhere in a row is INVALID_ARGUMENT naming the first bad row, with the
// reference's exact message; y is left untouched.
TEST_F(CublasLtTest, RejectsNonFiniteRowsLikeTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Bad {
    int64_t row, col;
    float v;
  };
  const std::vector<std::vector<Bad>> plans = {
      {{5, 3, nan}, {9, 0, inf}}, {{0, 63, -inf}}, {{11, 17, inf}, {11, 18, nan}}, {{7, 0, nan}}};
  struct Rows {
    int64_t m, k;
  };
  // 12 rows: a block per row (16-bit x: each row in registers, quantize_rows_regs_s8); 1100 rows
  // of 64 and of 4096: the quantize kernel's warp-per-row form (16-bit x), a block per row (fp32
  // x); 2600 rows of 8192 (43 MB): its rings of rows in shared memory (16-bit x); 40 rows of 8208
  // values: a block per row, each row in shared memory (16-bit x); 300 rows of 4096: a block per
  // row, in registers (16-bit x).
  const Rows sizes[] = {{12, 64}, {1100, 64}, {1100, 4096}, {2600, 8192}, {40, 8208}, {300, 4096}};
  for (Scheme scheme : kSchemes) {
    for (const Rows& rows : sizes) {
      const int64_t m = rows.m, k = rows.k;
      const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 16, k, true));
      if (p.kernel == nullptr) return;
      for (DType xt : kDTypes) {
        for (const auto& plan : plans) {
          std::vector<uint8_t> x = make_x(rng, m, k, xt);
          for (const Bad& b : plan) store_from_f32(x.data(), xt, b.row * k + b.col, b.v);
          const Expected want = reference_run(*p.weights, x.data(), xt, m, DType::kBF16);
          ASSERT_EQ(want.status.code(), absl::StatusCode::kInvalidArgument);
          std::vector<uint16_t> y(m * 16, 0xBEEF);
          RunArgs args;
          args.x = x.data();
          args.x_dtype = xt;
          args.m = m;
          args.y = y.data();
          args.y_dtype = DType::kBF16;
          const absl::Status st = p.kernel->run(args, nullptr);
          EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
          EXPECT_EQ(st.message(), want.status.message());
          EXPECT_TRUE(absl::StartsWith(
              st.message(), absl::StrCat("x row ", plan[0].row, " holds a non-finite value")))
              << st.message();
          EXPECT_EQ(y, std::vector<uint16_t>(m * 16, 0xBEEF)) << "y was written on error";
        }
      }
    }
  }
}

// Small calls replayed from the serving path's CUDA graphs stay exact (check_replayed_calls).
TEST_F(CublasLtTest, ReplayedSmallCallsMatchTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  check_replayed_calls(*kernel_, rng,
                       [](const LayerConfig&, int64_t, DType, DType) { return true; });
}

// Small calls with their outputs written straight to the host and copied back stay exact
// (check_outputs_both_ways).
TEST_F(CublasLtTest, OutputsWrittenToTheHostOrCopiedBackMatchTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  check_outputs_both_ways(*kernel_, rng,
                          [](const LayerConfig&, int64_t, DType, DType) { return true; });
}

// With CUDA graphs turned off (qlinear-server --cuda-graphs=false) calls stay exact, make no
// graph and are timed stage by stage.
TEST_F(CublasLtTest, GraphsTurnedOffMakeNone) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int live_before = CallGraphs::live();
  enable_cuda_graphs(false);
  {
    const Prepared p =
        prepare(*kernel_, make_layer(rng, Scheme::kDynamicAsymmetric, 64, 128, true));
    if (p.kernel == nullptr) {
      enable_cuda_graphs(true);
      return;
    }
    for (int i = 0; i < 3 * StreamPool::kContexts; ++i) {
      EXPECT_TRUE(check_run(p, make_x(rng, 1, 128, DType::kBF16), DType::kBF16, 1, DType::kBF16));
    }
    EXPECT_EQ(CallGraphs::live(), live_before);
  }
  enable_cuda_graphs(true);
}

// The serving entry point (`run`): y, sa and azp in the caller's buffers, timings filled.
TEST_F(CublasLtTest, RunFillsOutputsAndTimings) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  for (Scheme scheme : kSchemes) {
    const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 64, 128, true));
    if (p.kernel == nullptr) return;
    const int64_t m = rng.range(1, 300);
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
    EXPECT_GT(t.quantize_ns, 0);
    EXPECT_GT(t.gemm_ns, 0);
    EXPECT_GT(t.copy_ns, 0);
    EXPECT_EQ(p.kernel->device(), "cuda:0");
    EXPECT_GE(p.kernel->extra_bytes(), 64 * 128);
  }
}

// Requests large enough that x and y cross the host in several chunks: every chunk lands, and a
// bad row found late still leaves y untouched.
TEST_F(CublasLtTest, LargeRequestsCopyEveryChunk) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t n = 1024, k = 512, m = 2100 + rng.range(0, 99);
  const Prepared p = prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, n, k, true));
  if (p.kernel == nullptr) return;
  std::vector<uint8_t> x = make_x(rng, m, k, DType::kF32, false);  // 4.3 MB: 3 chunks
  const Expected want = reference_run(*p.weights, x.data(), DType::kF32, m, DType::kF32);
  std::vector<uint8_t> y(static_cast<size_t>(m * n * 4), 0xA5);  // 8.6 MB: 5 chunks
  RunArgs args;
  args.x = x.data();
  args.x_dtype = DType::kF32;
  args.m = m;
  args.y = y.data();
  args.y_dtype = DType::kF32;
  ASSERT_TRUE(p.kernel->run(args, nullptr).ok());
  EXPECT_EQ(first_y_mismatch(want.y, y, DType::kF32), -1);

  store_from_f32(x.data(), DType::kF32, static_cast<size_t>((m - 3) * k + 7),
                 std::numeric_limits<float>::infinity());
  std::fill(y.begin(), y.end(), uint8_t{0xA5});
  const absl::Status st = p.kernel->run(args, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            absl::StrCat("x row ", m - 3, " holds a non-finite value (inf at column 7)"));
  EXPECT_EQ(std::count(y.begin(), y.end(), uint8_t{0xA5}), static_cast<std::ptrdiff_t>(y.size()))
      << "y was written on error";
}

// The serving path's copies at the sizes where their form changes: x of 256 KB or more written to
// pinned memory with streaming stores; copies of up to 1 MB done by a kernel on the mapped pinned
// memory, larger ones by the copy engine, in chunks past 2 MB; calls of up to 64 rows replayed from
// a graph. Each size runs on every stream context, replays included, and is checked bit for bit.
TEST_F(CublasLtTest, ServingPathCopiesOfEverySize) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t n = 1024, k = 4096;
  const Prepared p = prepare(*kernel_, make_layer(rng, Scheme::kDynamicAsymmetric, n, k, true));
  if (p.kernel == nullptr) return;
  struct Size {
    int64_t m;
    DType yt;
    int calls;
  };
  // bf16 x: 512 KB (graph), 800 KB, 2.4 MB (chunked); y: 256 KB, 800 KB (bf16), 1.2 MB and
  // 2.4 MB (f32, the latter chunked).
  const Size sizes[] = {{64, DType::kF32, 2 * StreamPool::kContexts + 1},
                        {100, DType::kBF16, StreamPool::kContexts},
                        {300, DType::kF32, 2},
                        {600, DType::kF32, 1}};
  for (const Size& sz : sizes) {
    SCOPED_TRACE(absl::StrCat("M=", sz.m));
    for (int i = 0; i < sz.calls; ++i) {
      ASSERT_TRUE(check_run(p, make_x(rng, sz.m, k, DType::kBF16), DType::kBF16, sz.m, sz.yt))
          << "call " << i;
    }
  }
}

// Staging reserved up front (qlinear-server --gpu-staging-mb): every context holds at least the
// bytes asked for, a request that fits leaves every buffer where it was, and a second, smaller
// reservation changes nothing. The requests are checked bit for bit.
TEST_F(CublasLtTest, ReservedStagingServesRequestsWithoutGrowing) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t n = 1024, k = 4096;
  const Prepared p = prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, n, k, true));
  if (p.kernel == nullptr) return;
  auto pool = StreamPool::get();
  ASSERT_TRUE(pool.ok()) << pool.status();
  // Enough for M = 1024 below: x 8 MB and y 2 MB, and on the device also xq, int32 accumulators
  // and cuBLASLt's 32 MB workspace.
  constexpr size_t kBytes = size_t{64} << 20;
  ASSERT_TRUE((*pool)->reserve_all(kBytes).ok());
  auto buffers = [&] {
    std::vector<std::pair<const void*, const void*>> out;
    for_every_context(**pool, [&](StreamContext& ctx) {
      EXPECT_GE(ctx.host.size(), kBytes) << "context " << ctx.index;
      EXPECT_GE(ctx.device.size(), kBytes) << "context " << ctx.index;
      out.push_back({ctx.host.get(), ctx.device.get()});
    });
    std::sort(out.begin(), out.end());
    return out;
  };
  const auto before = buffers();
  ASSERT_EQ(before.size(), static_cast<size_t>(StreamPool::kContexts));
  // M = 1024 (x in chunks) and M = 16 (replayed from a graph).
  for (int64_t m : {int64_t{1024}, int64_t{16}}) {
    SCOPED_TRACE(absl::StrCat("M=", m));
    for (int i = 0; i < StreamPool::kContexts + 1; ++i) {
      ASSERT_TRUE(check_run(p, make_x(rng, m, k, DType::kBF16), DType::kBF16, m, DType::kBF16))
          << "call " << i;
    }
  }
  EXPECT_EQ(buffers(), before) << "a request that fits the reservation moved a buffer";
  ASSERT_TRUE((*pool)->reserve_all(kBytes / 2).ok());
  EXPECT_EQ(buffers(), before) << "a smaller reservation moved a buffer";
}

// A reservation that cannot fit fails with the reason and leaves nothing reserved behind; the
// contexts then grow on demand, and requests are still exact.
TEST_F(CublasLtTest, ReservationThatDoesNotFitLeavesNothingBehind) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const Prepared p = prepare(*kernel_, make_layer(rng, Scheme::kStaticSymmetric, 256, 512, true));
  if (p.kernel == nullptr) return;
  auto pool = StreamPool::get();
  ASSERT_TRUE(pool.ok()) << pool.status();
  const absl::Status s = (*pool)->reserve_all(size_t{1} << 50);  // 1 PiB
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "the GPU staging reserved at start-up")) << s;
  for_every_context(**pool, [](StreamContext& ctx) {
    EXPECT_EQ(ctx.device.size(), 0u) << "context " << ctx.index;
    EXPECT_EQ(ctx.host.size(), 0u) << "context " << ctx.index;
  });
  for (int i = 0; i < StreamPool::kContexts + 1; ++i) {
    const int64_t m = rng.range(1, 80);
    ASSERT_TRUE(check_run(p, make_x(rng, m, 512, DType::kF16), DType::kF16, m, DType::kBF16))
        << "call " << i << ", M=" << m;
  }
}

// What a context grew past the reservation for larger requests is given back by trim once no
// request has needed it for the idle time, and not before; a context in use is skipped; the
// reservation stays; requests after a trim (new buffers, graphs captured again) are exact.
TEST_F(CublasLtTest, TrimGivesBackWhatGrewPastTheReservation) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t n = 1024, k = 4096;
  const Prepared p = prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, n, k, true));
  if (p.kernel == nullptr) return;
  auto pool = StreamPool::get();
  ASSERT_TRUE(pool.ok()) << pool.status();
  constexpr size_t kKeep = size_t{1} << 20;
  ASSERT_TRUE((*pool)->reserve_all(kKeep).ok());
  EXPECT_EQ((*pool)->keep_bytes(), kKeep);
  const auto zero = std::chrono::steady_clock::duration::zero();
  (*pool)->trim(zero);  // what earlier tests grew
  // Each context's (pinned, device) bytes, by index, every context held at once.
  auto sizes = [&] {
    std::vector<std::pair<size_t, size_t>> out(StreamPool::kContexts);
    for_every_context(**pool, [&](StreamContext& ctx) {
      out[ctx.index] = {ctx.host.size(), ctx.device.size()};
    });
    return out;
  };
  const std::vector<std::pair<size_t, size_t>> kept(StreamPool::kContexts, {kKeep, kKeep});
  ASSERT_EQ(sizes(), kept);
  EXPECT_EQ((*pool)->staging_bytes().host, StreamPool::kContexts * kKeep);
  EXPECT_EQ((*pool)->staging_bytes().device, StreamPool::kContexts * kKeep);

  // M = 512: x 4 MB, y 1 MB (and cuBLASLt's workspace on the device), on every context.
  auto serve = [&](int64_t m, int calls) {
    for (int i = 0; i < calls; ++i) {
      if (!check_run(p, make_x(rng, m, k, DType::kBF16), DType::kBF16, m, DType::kBF16)) {
        ADD_FAILURE() << "M=" << m << ", call " << i;
        return;
      }
    }
  };
  serve(16, 3 * StreamPool::kContexts);  // replayed from graphs, on the grown buffers
  serve(512, 2 * StreamPool::kContexts);
  const auto grown = sizes();
  for (int i = 0; i < StreamPool::kContexts; ++i) {
    EXPECT_GT(grown[i].first, kKeep) << "context " << i;
    EXPECT_GT(grown[i].second, kKeep) << "context " << i;
  }
  EXPECT_EQ((*pool)->trim(std::chrono::hours(1)), 0u) << "released what was needed just now";
  EXPECT_EQ(sizes(), grown);

  // One context held by another thread while the others are trimmed.
  std::atomic<int> busy_index{-1};
  absl::Notification held, trimmed;
  std::thread holder([&] {
    StreamContext* busy = (*pool)->acquire();
    busy_index = busy->index;
    held.Notify();
    trimmed.WaitForNotification();
    (*pool)->release(busy);
  });
  held.WaitForNotification();
  const size_t released = (*pool)->trim(zero);
  trimmed.Notify();
  holder.join();
  size_t want_released = 0;
  const auto after = sizes();
  for (int i = 0; i < StreamPool::kContexts; ++i) {
    if (i == busy_index) {
      EXPECT_EQ(after[i], grown[i]) << "the context in use was trimmed";
    } else {
      EXPECT_EQ(after[i], kept[i]) << "context " << i;
      want_released += grown[i].first + grown[i].second - 2 * kKeep;
    }
  }
  EXPECT_EQ(released, want_released);
  size_t host = 0, device = 0;
  for (const auto& [h, d] : after) host += h, device += d;
  EXPECT_EQ((*pool)->staging_bytes().host, host);
  EXPECT_EQ((*pool)->staging_bytes().device, device);
  EXPECT_GT((*pool)->trim(zero), 0u);
  EXPECT_EQ(sizes(), kept);

  // Replayed small calls on new buffers, then a large call again.
  serve(16, 3 * StreamPool::kContexts);
  serve(512, StreamPool::kContexts);
}

// Requests on one layer from many threads at once share the stream pool; each must get its own
// answer.
TEST_F(CublasLtTest, ConcurrentRequestsGetTheirOwnResults) {
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
      j.m = rng.range(1, 200);
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

// Unaligned shapes: the kernel declines with the reason and the registry picks a CPU kernel.
TEST_F(CublasLtTest, RegistryFallsBackToCpuOnUnalignedShapes) {
  Registry registry;
  ASSERT_EQ(register_builtin_kernels(&registry), absl::OkStatus());
  struct Shape {
    int64_t n, k;
    const char* reason;
  };
  for (const Shape& s : {Shape{64, 102, "K=102 is not a multiple of 4"},
                         Shape{50, 128, "N=50 is not a multiple of 4"}}) {
    LayerConfig c;
    c.n = s.n;
    c.k = s.k;
    const ProblemShape shape{1, s.n, s.k, DType::kBF16, DType::kBF16};
    auto sel = registry.select(host_info(), c, shape, "", 1, 1);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_TRUE(absl::StartsWith(sel->kernel->name(), "cpu.")) << sel->kernel->name();
    bool seen = false;
    for (const CandidateVerdict& v : sel->explanation) {
      if (v.kernel != kCublasLtKernelName) continue;
      seen = true;
      EXPECT_FALSE(v.selected);
      EXPECT_TRUE(absl::StrContains(v.reason, s.reason)) << v.reason;
    }
    EXPECT_TRUE(seen);
  }
  LayerConfig aligned;
  aligned.n = 64;
  aligned.k = 128;
  auto sel = registry.select(host_info(), aligned,
                             ProblemShape{1, 64, 128, DType::kBF16, DType::kBF16}, "", 1, 1);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_TRUE(absl::StartsWith(sel->kernel->name(), "cuda.")) << sel->kernel->name();
}

// --- What runs without a GPU --------------------------------------------------------------

// The fallback chain a shape takes on an H100 (a fake one: selection reads the host's description
// and the shape only): the small-M and CUTLASS kernels need 16-byte rows, cuBLASLt rows of 4
// bytes, and a CPU kernel takes the rest; each decline names its reason.
TEST(CudaSelection, UnalignedShapesFallBackThroughTheChain) {
  if (!cutlass_sm90_compiled_in() || !check_cuda_arch(compiled_cuda_archs(), 9, 0).ok()) {
    GTEST_SKIP() << "this build has no sm_90a CUTLASS kernel";
  }
  Registry registry;
  ASSERT_EQ(register_builtin_kernels(&registry), absl::OkStatus());
  HostInfo h = host_info();
  h.cuda_compiled = true;
  h.gpus = {GpuInfo{0, "Fake H100", 9, 0, int64_t{80} << 30, 132}};
  struct Case {
    int64_t m, n, k;
    const char* taker;  // a name, or "cpu." for any CPU kernel
  };
  for (const Case& c :
       {Case{1, 64, 128, kStreamS8KernelName}, Case{256, 64, 128, kCutlassSm90KernelName},
        Case{1, 64, 104, kCublasLtKernelName}, Case{256, 72, 128, kCublasLtKernelName},
        Case{1, 64, 102, "cpu."}, Case{1, 50, 128, "cpu."}}) {
    SCOPED_TRACE(absl::StrCat("M=", c.m, " N=", c.n, " K=", c.k));
    LayerConfig config;
    config.n = c.n;
    config.k = c.k;
    auto sel = registry.select(h, config, ProblemShape{c.m, c.n, c.k, DType::kBF16, DType::kBF16},
                               "", c.m, c.m);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_TRUE(absl::StartsWith(sel->kernel->name(), c.taker)) << sel->kernel->name();
    for (const CandidateVerdict& v : sel->explanation) {
      if (!v.selected && absl::StartsWith(v.kernel, "cuda.")) {
        EXPECT_FALSE(v.reason.empty()) << v.kernel;
      }
    }
  }
}

TEST(CublasLtKernel, DeclinesShapesItCannotRun) {
  auto k = make_cublaslt_kernel();
  EXPECT_EQ(k->name(), "cuda.cublaslt");
  LayerConfig c;
  c.n = 64;
  c.k = 102;
  ProblemShape s{1, 64, 102, DType::kBF16, DType::kBF16};
  absl::Status st = k->can_implement(c, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(), "K=102 is not a multiple of 4 (cuBLASLt int8 GEMM alignment)");
  c.k = 128;
  c.n = 50;
  s = ProblemShape{1, 50, 128, DType::kBF16, DType::kBF16};
  EXPECT_EQ(k->can_implement(c, s).message(),
            "N=50 is not a multiple of 4 (cuBLASLt int8 GEMM alignment)");
  c.n = 64;
  s = ProblemShape{1, 64, 128, DType::kF32, DType::kF16};
  EXPECT_TRUE(k->can_implement(c, s).ok());
  s.m = 0;
  EXPECT_FALSE(k->can_implement(c, s).ok());
  // Every M is welcome: this is the universal GPU fallback.
  EXPECT_EQ(k->preferred_m().min, 1);
  EXPECT_EQ(k->preferred_m().max, std::numeric_limits<int64_t>::max());
}

TEST(CublasLtKernel, IsSupportedNamesWhatIsMissing) {
  auto k = make_cublaslt_kernel();
  HostInfo h;
  h.cuda_compiled = true;
  h.cuda_error = "cudaErrorNoDevice: no CUDA-capable device is detected";
  absl::Status st = k->is_supported(h);
  EXPECT_EQ(st.message(), "no CUDA device (cudaErrorNoDevice: no CUDA-capable device is detected)");

  // A device this build has no code for (the default build holds sm_90a only).
  h.gpus.push_back(GpuInfo{0, "Fake GPU", 7, 5, int64_t{16} << 30, 40});
  st = k->is_supported(h);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(absl::StartsWith(st.message(), "compiled for ")) << st.message();
  EXPECT_TRUE(absl::EndsWith(st.message(), ", device is sm_75")) << st.message();
}

}  // namespace
}  // namespace qlinear::gpu::testing
