// cuda.cutlass_sm90 beyond the shared fused-kernel tests (gemv_s8_test.cc): large M on shapes
// with tails in every dimension (M, N and K not multiples of the tiles), every tile
// configuration and output type through the device entry points, and what is reported when the
// kernel is not compiled in. Without a usable GPU the GPU tests skip with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "kernels/core/status.h"
#include "kernels/core/tuning_cache.h"
#include "kernels/cuda/cuda_host_call.h"
#include "kernels/cuda/cutlass_sm90_device.h"
#include "kernels/cuda/cutlass_sm90_gemm.h"
#include "kernels/cuda/quantize_s8.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace qlinear::gpu::testing {
namespace {

class CutlassSm90Test : public ::testing::Test {
 protected:
  void SetUp() override {
    QLINEAR_REQUIRE_GPU();
    const absl::Status s = kernel_->is_supported(host_info());
    if (!s.ok()) GTEST_SKIP() << "cuda.cutlass_sm90 cannot run here: " << s.message();
  }
  std::unique_ptr<Kernel> kernel_ = make_cutlass_sm90_kernel();
};

// Every scheme at M past the medium-M rung (128 x 128 tiles), on N = 272 and K = 528 (tails of
// the 128-wide tiles), and the largest M with other input and output types. Only a layer with
// zero points holds the weights' column sums for the tiles' epilogue.
TEST_F(CutlassSm90Test, MatchesReferenceForLargeM) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  int64_t symmetric_bytes = -1, asymmetric_bytes = -1;
  for (Scheme scheme : kSchemes) {
    const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 272, 528, true));
    if (p.kernel == nullptr) return;
    for (int64_t m : {int64_t{257}, 1000 + rng.range(1, 200)}) {
      EXPECT_TRUE(check_call(p, make_x(rng, m, 528, DType::kBF16), DType::kBF16, m, DType::kBF16));
    }
    if (scheme == Scheme::kDynamicSymmetric) symmetric_bytes = p.kernel->extra_bytes();
    if (scheme == Scheme::kDynamicAsymmetric) asymmetric_bytes = p.kernel->extra_bytes();
  }
  // The asymmetric layer's device copy holds azp_adj [N] int32 besides, and the tiles' column
  // sums [N] int32; the symmetric layer's epilogue has no zero-point term and holds neither.
  ASSERT_GE(symmetric_bytes, 0);
  ASSERT_GE(asymmetric_bytes, 0);
  EXPECT_EQ(asymmetric_bytes - symmetric_bytes, 2 * 272 * 4);
  const Prepared p =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicAsymmetric, 272, 528, false));
  if (p.kernel == nullptr) return;
  const int64_t m = 4096 + rng.range(1, 100);
  EXPECT_TRUE(check_call(p, make_x(rng, m, 528, DType::kF32), DType::kF32, m, DType::kF16));
  EXPECT_TRUE(check_call(p, make_x(rng, m, 528, DType::kF16), DType::kF16, m, DType::kF32));
  // What a request's explanation names: the tile timed at load, the launch up to M = 64, and the
  // finalists' times at load, fastest first.
  const std::string at1 = p.owner->variant(1), at_m = p.owner->variant(m);
  EXPECT_TRUE(absl::StartsWith(at1, "tile ")) << at1;
  EXPECT_TRUE(absl::StrContains(at1, "(timed fastest at load, M=1)")) << at1;
  EXPECT_TRUE(absl::StrContains(at1, "programmatic dependent")) << at1;
  const size_t times = at1.find("; at load, M=1 (us): tile ");
  ASSERT_NE(times, std::string::npos) << at1;
  EXPECT_NE(at1.find(", tile ", times), std::string::npos) << "one finalist only: " << at1;
  // No tile whose cluster would hold a CTA without tokens (up to 64 tokens, every cluster's).
  for (int64_t small : {int64_t{1}, int64_t{16}, int64_t{64}}) {
    EXPECT_FALSE(absl::StrContains(p.owner->variant(small), "cluster")) << p.owner->variant(small);
  }
  EXPECT_TRUE(absl::StrContains(at_m, "(timed fastest at load, M=8192)")) << at_m;
  EXPECT_FALSE(absl::StrContains(at_m, "programmatic dependent")) << at_m;
}

// Layers of one shape sharing a TuningCache: the second takes the first one's tiles at every M
// (its explanation says so) and answers exactly; a layer of another N or scheme times its own.
TEST_F(CutlassSm90Test, LaterLayersOfAShapeTakeTheFirstOnesTiles) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  TuningCache tuning;
  const Prepared first =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, 272, 528, true), &tuning);
  if (first.kernel == nullptr) return;
  EXPECT_EQ(tuning.size(), 1u);
  const Prepared second =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, 272, 528, true), &tuning);
  ASSERT_NE(second.kernel, nullptr);
  EXPECT_EQ(tuning.size(), 1u);
  const std::string note(kTunedByEarlierLayer);
  for (int64_t m : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{256}, int64_t{2048}}) {
    const std::string v1 = first.owner->variant(m), v2 = second.owner->variant(m);
    EXPECT_FALSE(absl::StrContains(v1, note)) << v1;
    EXPECT_TRUE(absl::StrContains(v2, absl::StrCat(note, ")"))) << v2;
    EXPECT_EQ(absl::StrReplaceAll(v2, {{note, ""}}), v1) << "M=" << m;
  }
  for (int64_t m : {int64_t{1}, int64_t{16}, 40 + rng.range(0, 20), int64_t{300}}) {
    EXPECT_TRUE(
        check_call(second, make_x(rng, m, 528, DType::kBF16), DType::kBF16, m, DType::kBF16));
  }
  // A load times its tiles up to kRotateMaxM over copies of the weights (the GPU has the memory).
  const int64_t over_copies = cutlass_sm90_timings_over_copies();
  const Prepared wider =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, 288, 528, true), &tuning);
  ASSERT_NE(wider.kernel, nullptr);
  const Prepared asym =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicAsymmetric, 272, 528, true), &tuning);
  ASSERT_NE(asym.kernel, nullptr);
  EXPECT_EQ(tuning.size(), 3u);
  EXPECT_EQ(cutlass_sm90_timings_over_copies(), over_copies + 2);
  for (const Prepared* p : {&wider, &asym}) {
    const std::string v = p->owner->variant(1);
    EXPECT_TRUE(absl::StrContains(v, "(timed fastest at load, M=1)")) << v;
  }
  EXPECT_TRUE(check_call(asym, make_x(rng, 1, 528, DType::kBF16), DType::kBF16, 1, DType::kBF16));

  // Prepared on demand (as a request prepares a kernel the load did not): a stored shape's tiles
  // are taken; a new shape's are timed cold (no weight copies), said to be timed on first use,
  // and not stored.
  const Prepared taken =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, 272, 528, true), &tuning,
              /*on_demand=*/true);
  ASSERT_NE(taken.kernel, nullptr);
  for (int64_t m : {int64_t{1}, int64_t{64}, int64_t{2048}}) {
    EXPECT_EQ(taken.owner->variant(m), second.owner->variant(m)) << "M=" << m;
  }
  const Prepared timed =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, 304, 528, true), &tuning,
              /*on_demand=*/true);
  ASSERT_NE(timed.kernel, nullptr);
  EXPECT_EQ(tuning.size(), 3u);
  EXPECT_EQ(cutlass_sm90_timings_over_copies(), over_copies + 2);
  for (int64_t m : {int64_t{1}, int64_t{16}, int64_t{256}}) {
    const std::string v = timed.owner->variant(m);
    EXPECT_TRUE(absl::StrContains(v, absl::StrCat("(timed fastest on first use, M=", m, ")"))) << v;
    EXPECT_FALSE(absl::StrContains(v, "at load")) << v;
    EXPECT_TRUE(
        check_call(timed, make_x(rng, m, 528, DType::kBF16), DType::kBF16, m, DType::kBF16));
  }
}

// Past the largest M a layer's operands let it time at load (256 MB each), a call takes the tile
// timed at the largest M from 2048 on and names it; below 2048, a rule. K = 32784: x of 4096 rows
// holds 268 MB, so 2048 is the largest timed M; K = 65552: 1024 is.
TEST_F(CutlassSm90Test, CallsPastTheLargestTimedMTakeItsTile) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const Prepared p = prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, 64, 32784, true));
  if (p.kernel == nullptr) return;
  for (int64_t m : {int64_t{2000}, int64_t{3000}, int64_t{4096}, int64_t{9000}}) {
    const std::string v = p.owner->variant(m);
    EXPECT_TRUE(absl::StrContains(v, "(timed fastest at load, M=2048)")) << "M=" << m << ": " << v;
  }
  const Prepared q = prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, 64, 65552, true));
  if (q.kernel == nullptr) return;
  EXPECT_TRUE(absl::StrContains(q.owner->variant(1000), "(timed fastest at load, M=1024)"))
      << q.owner->variant(1000);
  for (int64_t m : {int64_t{2000}, int64_t{9000}}) {
    const std::string v = q.owner->variant(m);
    EXPECT_TRUE(absl::StrContains(v, "(by rule: not timed at load")) << "M=" << m << ": " << v;
  }
}

// A layer loaded on a GPU short of memory still loads, y exact: with room for the load's timing
// buffers at M = 4096 (80 MB) but not at 8192 (160 MB) it times the tiles up to 4096, and calls
// past that take the choice there; without room for its cold timings' L2 flush buffer it times
// nothing and takes the rules (at M = 1 the swapped 16 x 64 x 256 tile); with room for every M
// (8192: 160 MB) but not for the weight copies of the timing as served (240 MB, kRotateMaxM) it
// times every M, up to 64 cold. None is kept for the next layer of the shape (TuningCache), which,
// with the memory back, times every M.
TEST_F(CutlassSm90Test, LoadShortOfMemoryTimesFewerM) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const auto w = make_layer(rng, Scheme::kDynamicSymmetric, 4096, 4096, true);
  ASSERT_NE(w, nullptr);
  {
    // Once with the memory free, so that the kernels' code is loaded before the GPU fills up.
    const Prepared warm = prepare(*kernel_, w);
    if (warm.kernel == nullptr) return;
  }
  const absl::StatusOr<int64_t> l2 = device_l2_bytes();
  ASSERT_TRUE(l2.ok()) << l2.status();
  const size_t flush = std::max<size_t>(size_t{128} << 20, size_t{4} * static_cast<size_t>(*l2));
  const size_t layer = size_t{24} << 20;  // the weights (16 MB) and their per-channel data
  TuningCache tuning;
  // 0: room for M = 4096, 1: no room for the flush buffer, 2: room for every M, not the copies.
  for (const int room : {0, 1, 2}) {
    SCOPED_TRACE(room == 0   ? "room for M = 4096"
                 : room == 1 ? "no room for the flush buffer"
                             : "room for every M but not the weight copies");
    const bool timing_room = room != 1;
    const size_t keep = room == 0   ? layer + flush + (size_t{120} << 20)
                        : room == 1 ? layer + (16 << 20)
                                    : layer + flush + (size_t{200} << 20);
    size_t free_bytes = 0, total_bytes = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
    ASSERT_GT(free_bytes, keep);
    DeviceBuffer filler;
    ASSERT_TRUE(filler.allocate(free_bytes - keep, "memory the test takes").ok());
    const Prepared p = prepare(*kernel_, w, &tuning);
    ASSERT_NE(p.kernel, nullptr);
    EXPECT_EQ(tuning.size(), 0u);
    const std::string at1 = p.owner->variant(1), at_max = p.owner->variant(8192);
    if (timing_room) {
      EXPECT_TRUE(absl::StrContains(at1, "(timed fastest at load, M=1)")) << at1;
      EXPECT_TRUE(absl::StrContains(at_max, room == 0 ? "(timed fastest at load, M=4096)"
                                                      : "(timed fastest at load, M=8192)"))
          << at_max;
    } else {
      EXPECT_TRUE(absl::StrContains(at1, "(by rule: not timed at load")) << at1;
      EXPECT_TRUE(absl::StrContains(at_max, "(by rule: not timed at load")) << at_max;
      // The rule up to 16 tokens: the swapped 16 x 64 x 256 tile.
      EXPECT_TRUE(absl::StrContains(at1, "16x64x256 pingpong, operands swapped")) << at1;
    }
    for (int64_t m : {int64_t{1}, int64_t{64}}) {
      EXPECT_TRUE(check_call(p, make_x(rng, m, 4096, DType::kBF16), DType::kBF16, m, DType::kBF16));
    }
  }
  const Prepared roomy = prepare(*kernel_, w, &tuning);
  ASSERT_NE(roomy.kernel, nullptr);
  EXPECT_EQ(tuning.size(), 1u);
  const std::string at_max = roomy.owner->variant(8192);
  EXPECT_TRUE(absl::StrContains(at_max, "(timed fastest at load, M=8192)")) << at_max;
}

// Decode calls on long rows (K = 16512: the quantize kernel's split form would give each row 8
// blocks): at M = 4 it splits them, at M = 12 and 16 it keeps each row in one block so as to
// leave the GEMM most SMs (split_quantize_rows). y bit-exact for every scheme either way.
TEST_F(CutlassSm90Test, FewLongRowsMatchTheReferenceSplitOrWhole) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t k = 16512;
  for (Scheme scheme : kSchemes) {
    const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 272, k, true));
    if (p.kernel == nullptr) return;
    for (int64_t m : {int64_t{4}, int64_t{12}, int64_t{16}}) {
      EXPECT_TRUE(check_call(p, make_x(rng, m, k, DType::kBF16), DType::kBF16, m, DType::kBF16))
          << scheme_name(scheme) << " M " << m;
    }
  }
}

#if QLINEAR_HAVE_CUTLASS
// A layer's operands on the device for the tile entry points, and the arguments of one call.
struct TileBuffers {
  int64_t m = 0, n = 0, k = 0;
  int64_t xq_rows = 0;  // rows xq holds: cutlass_sm90::xq_rows_for(m)
  DeviceBuffer w, sb, adj, bias, xq, sa, azp, y;

  // w, sb and the column sums (for every scheme: the quantizer's azp selects what they do, see
  // the header) uploaded; room for m tokens' sa, azp and y of any type, and for xq_rows tokens'
  // xq, filled with -127 (rows past m that a tile reading them would mix into y).
  absl::Status init(const LayerWeights& lw, int64_t tokens) {
    m = tokens;
    n = lw.config.n;
    k = lw.config.k;
    xq_rows = cutlass_sm90::xq_rows_for(m);
    std::vector<int32_t> colsum(n, 0);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < k; ++i) colsum[r] += lw.w[r * k + i];
    }
    for (auto [b, bytes] : {std::pair{&w, n * k},
                            {&sb, n * 4},
                            {&adj, n * 4},
                            {&bias, n * 4},
                            {&xq, xq_rows * k},
                            {&sa, m * 4},
                            {&azp, m * 4},
                            {&y, m * n * 4}}) {
      RETURN_IF_ERROR(b->allocate(static_cast<size_t>(bytes), "test operand"));
    }
    RETURN_IF_CUDA_ERROR(cudaMemcpy(w.get(), lw.w.data(), n * k, cudaMemcpyHostToDevice));
    RETURN_IF_CUDA_ERROR(cudaMemcpy(sb.get(), lw.sb.data(), n * 4, cudaMemcpyHostToDevice));
    RETURN_IF_CUDA_ERROR(cudaMemcpy(adj.get(), colsum.data(), n * 4, cudaMemcpyHostToDevice));
    RETURN_IF_CUDA_ERROR(cudaMemset(xq.get(), 0x81, static_cast<size_t>(xq_rows * k)));
    return absl::OkStatus();
  }
  // bias_v for the layer and output type yt (see CutlassSm90Args), uploaded.
  absl::Status upload_bias(const LayerWeights& lw, DType yt) {
    std::vector<float> bias_v(n, is_asymmetric(lw.config.scheme) ? 0.f : -0.f);
    if (lw.config.has_bias) {
      for (int64_t i = 0; i < n; ++i) bias_v[i] = round_to_dtype(lw.bias[i], yt);
    }
    RETURN_IF_CUDA_ERROR(cudaMemcpy(bias.get(), bias_v.data(), n * 4, cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
  CutlassSm90Args args(DType yt) const {
    CutlassSm90Args g;
    g.xq = xq.as<int8_t>();
    g.w = w.as<int8_t>();
    g.m = m;
    g.n = n;
    g.k = k;
    g.sa = sa.as<float>();
    g.azp = azp.as<int32_t>();
    g.sb = sb.as<float>();
    g.adj = adj.as<int32_t>();
    g.bias_v = bias.as<float>();
    g.y = y.get();
    g.y_type = static_cast<ElemType>(yt);
    g.sm_count = host_info().gpus[0].sm_count;
    return g;
  }
};

// A stream for one test, destroyed with it (null if it could not be made). Blocking: the tests
// write stale operands, zeroed workspaces and poisoned outputs with cudaMemset, which on device
// memory returns before it runs and runs on the legacy stream; a non-blocking stream's kernels
// could run before those writes land, or under them.
struct TestStream {
  cudaStream_t stream = nullptr;
  TestStream() {
    if (cudaStreamCreate(&stream) != cudaSuccess) stream = nullptr;
  }
  ~TestStream() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
};

// One call of the dependent-launch tests: random bf16 x for m tokens of layer lw in device memory,
// the reference's y for it, and the tile buffers (bias_v for bf16 y).
struct DependentCall {
  QuantizeParams qp;
  Expected want;
  TileBuffers d;
  DeviceBuffer x;
  PinnedBuffer pinned_x;  // x again, where the quantize kernel reads it after pin_x()

  absl::Status init(SplitMix64& rng, const LayerWeights& lw, int64_t m) {
    qp = quantize_params(lw.config);
    const std::vector<uint8_t> hx = make_x(rng, m, lw.config.k, DType::kBF16);
    want = reference_run(lw, hx.data(), DType::kBF16, m, DType::kBF16);
    RETURN_IF_ERROR(want.status);
    RETURN_IF_ERROR(d.init(lw, m));
    RETURN_IF_ERROR(d.upload_bias(lw, DType::kBF16));
    RETURN_IF_ERROR(x.allocate(hx.size(), "x"));
    RETURN_IF_CUDA_ERROR(cudaMemcpy(x.get(), hx.data(), hx.size(), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }

  // x in mapped page-locked memory from now on, where the quantize kernel reads it across PCIe as
  // it reads a small served call's x: the kernel then takes microseconds longer, so that a
  // dependent GEMM reading the quantize kernel's results before its grid dependency wait (or
  // through a path that may return stale values) would get those of poison().
  absl::Status pin_x() {
    RETURN_IF_ERROR(pinned_x.reserve(x.size(), "x in pinned memory"));
    if (pinned_x.device_alias() == nullptr) return absl::InternalError("no device alias for x");
    RETURN_IF_CUDA_ERROR(cudaMemcpy(pinned_x.get(), x.get(), x.size(), cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }
  // Stale xq, sa and azp where the quantize kernel writes them: what a GEMM reading too early uses.
  absl::Status poison() const {
    RETURN_IF_CUDA_ERROR(cudaMemset(d.xq.get(), 0x5A, static_cast<size_t>(d.xq_rows * d.k)));
    RETURN_IF_CUDA_ERROR(cudaMemset(d.sa.get(), 0x3F, static_cast<size_t>(d.m * 4)));
    RETURN_IF_CUDA_ERROR(cudaMemset(d.azp.get(), 0x11, static_cast<size_t>(d.m * 4)));
    return absl::OkStatus();
  }

  // The quantize kernel (zeroing zero_count words at `zero`, as served for a claiming tile), then
  // `tile` launched with g (as its programmatic dependent where g.pdl), on `stream`; y checked
  // against the reference's, the first mismatch named.
  ::testing::AssertionResult matches(const cutlass_sm90::TileOps& tile, const CutlassSm90Args& g,
                                     cudaStream_t stream, void* workspace = nullptr,
                                     int32_t* zero = nullptr, int64_t zero_count = 0) const {
    if (const cudaError_t e =
            launch_quantize_s8(pinned_x.get() != nullptr ? pinned_x.device_alias() : x.get(),
                               ElemType::kBF16, d.m, d.k, qp, d.xq.as<int8_t>(), d.sa.as<float>(),
                               d.azp.as<int32_t>(), stream, zero, zero_count);
        e != cudaSuccess) {
      return ::testing::AssertionFailure() << "quantize launch: " << cudaGetErrorString(e);
    }
    if (const cudaError_t e = tile.launch(g, workspace, stream); e != cudaSuccess) {
      return ::testing::AssertionFailure() << "GEMM launch: " << cudaGetErrorString(e);
    }
    std::vector<uint8_t> y(static_cast<size_t>(d.m * d.n * 2));
    if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      return ::testing::AssertionFailure() << "the call: " << cudaGetErrorString(e);
    }
    if (const cudaError_t e = cudaMemcpy(y.data(), d.y.get(), y.size(), cudaMemcpyDeviceToHost);
        e != cudaSuccess) {
      return ::testing::AssertionFailure() << "y back: " << cudaGetErrorString(e);
    }
    const int64_t i = first_y_mismatch(want.y, y, DType::kBF16);
    if (i < 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "row " << i / d.n << " col " << i % d.n << " want "
                                         << load_as_f32(want.y.data(), DType::kBF16, i) << " got "
                                         << load_as_f32(y.data(), DType::kBF16, i);
  }
};

// Each tile configuration and output type through the device entry point, on the reference's
// own xq, sa and azp: y bit-exact for every scheme's form of the epilogue, with and without the
// weights' evict-first L2 hint (their loads then take the mainloop's own loop where each weight
// tile is read once), and with and without the last token block's rows past M read from xq
// (xq_rows; -127 there). Three shapes: tails in M, N and K for every tile; and two decode-like
// ones (16 tokens, 3 output tiles, 65 K steps; one token, a channel tail, 33 K steps).
TEST_F(CutlassSm90Test, EveryTileAndOutputTypeMatchesTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  struct Case {
    int64_t m, n, k;
  };
  for (const Case& cs : {Case{300, 400, 336}, Case{16, 272, 8336}, Case{1, 336, 4160}}) {
    const int64_t m = cs.m, n = cs.n, k = cs.k;
    for (Scheme scheme : kSchemes) {
      for (bool bias : {false, true}) {
        const auto w = make_layer(rng, scheme, n, k, bias);
        ASSERT_NE(w, nullptr);
        const std::vector<uint8_t> x = make_x(rng, m, k, DType::kF32);
        TileBuffers d;
        ASSERT_TRUE(d.init(*w, m).ok());
        for (DType yt : kDTypes) {
          const Expected want = reference_run(*w, x.data(), DType::kF32, m, yt);
          ASSERT_TRUE(want.status.ok());
          std::vector<int32_t> azp = want.azp;
          if (scheme == Scheme::kStaticAsymmetric) {
            azp.assign(m, w->config.input_zero_point);  // what cuda.quantize writes
          }
          ASSERT_TRUE(d.upload_bias(*w, yt).ok());
          ASSERT_EQ(cudaMemcpy(d.xq.get(), want.xq.data(), m * k, cudaMemcpyHostToDevice),
                    cudaSuccess);
          ASSERT_EQ(cudaMemcpy(d.sa.get(), want.sa.data(), m * 4, cudaMemcpyHostToDevice),
                    cudaSuccess);
          ASSERT_EQ(cudaMemcpy(d.azp.get(), azp.data(), m * 4, cudaMemcpyHostToDevice),
                    cudaSuccess);
          for (int run = 0; run < 4 * kCutlassSm90Tiles; ++run) {
            const int t = run / 4;
            if (tile_quantizes(static_cast<CutlassSm90Tile>(t))) continue;  // takes x: below
            CutlassSm90Args g = d.args(yt);
            g.weights_evict_first = run % 2 == 1;
            if (run % 4 >= 2) g.xq_rows = d.xq_rows;
            const cutlass_sm90::TileOps* ops =
                cutlass_sm90::tile_ops(static_cast<CutlassSm90Tile>(t), g.y_type);
            ASSERT_NE(ops, nullptr);
            ASSERT_EQ(ops->prepare(), cudaSuccess);
            ASSERT_EQ(ops->workspace_bytes(g), 0u);
            ASSERT_EQ(cudaMemset(d.y.get(), 0xA5, m * n * 4), cudaSuccess);
            ASSERT_EQ(ops->launch(g, nullptr, nullptr), cudaSuccess);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            std::vector<uint8_t> y(m * n * dtype_size(yt));
            ASSERT_EQ(cudaMemcpy(y.data(), d.y.get(), y.size(), cudaMemcpyDeviceToHost),
                      cudaSuccess);
            const int64_t i = first_y_mismatch(want.y, y, yt);
            EXPECT_EQ(i, -1) << scheme_name(scheme) << (bias ? " bias" : " no-bias") << " y "
                             << dtype_name(yt) << " tile " << t
                             << (g.weights_evict_first ? " evict-first" : "")
                             << (g.xq_rows > 0 ? " xq_rows" : "") << ": row " << i / n << " col "
                             << i % n << " want " << load_as_f32(want.y.data(), yt, i) << " got "
                             << load_as_f32(y.data(), yt, i);
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

// Every plain tile launched as the quantize kernel's programmatic dependent, as served (up to
// M = 64, and up to 128 for the tiles with a cluster), prefetching weights before it waits, with
// and without its first stages' weights issued before the wait: the GEMM must read the xq, sa
// and azp that the quantize kernel writes, not what was there before. y bit-exact for every
// scheme, at one token block and at 130 tokens (a cluster's second CTA past the last token
// block), with K longer than the pipeline and K of two k-tiles (every k-tile issued ahead), on
// the whole GPU and on a grid of 4 CTAs (each CTA then runs several tiles, only its first ahead;
// there at most 3 stages of its weights ahead, as the swapped tiles are served with a few, and
// at one token block the last, partial wave's weights prefetched into L2 by the other CTAs),
// with and without the weights' evict-first L2 hint (at 130 tokens the tiles of 128 tokens with a
// cluster multicast their weights from the mainloop's own loop).
TEST_F(CutlassSm90Test, EveryTileAsTheQuantizeKernelsDependentMatchesTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const TestStream owned;
  ASSERT_NE(owned.stream, nullptr);
  const cudaStream_t stream = owned.stream;
  const int64_t n = 400;
  struct Case {
    int64_t m, k;
  };
  for (const Case c : {Case{16, 4160}, Case{64, 4160}, Case{130, 4160}, Case{130, 256}}) {
    const int64_t m = c.m, k = c.k;
    for (Scheme scheme : kSchemes) {
      const auto w = make_layer(rng, scheme, n, k, /*bias=*/true);
      ASSERT_NE(w, nullptr);
      DependentCall call;
      ASSERT_TRUE(call.init(rng, *w, m).ok());
      TileBuffers& d = call.d;
      for (int run = 0; run < 8 * kCutlassSm90Tiles; ++run) {
        const int t = run / 8;
        const bool ahead = run % 2 == 1, few_ctas = run % 4 >= 2, evict_first = run % 8 >= 4;
        if (tile_quantizes(static_cast<CutlassSm90Tile>(t))) continue;
        SCOPED_TRACE(absl::StrCat(scheme_name(scheme), " M ", m, " K ", k, " tile ", t,
                                  ahead ? ", weights ahead" : "",
                                  few_ctas ? ", 4 CTAs, 3 stages ahead, tail prefetch" : "",
                                  evict_first ? ", evict-first, xq_rows" : ""));
        CutlassSm90Args g = d.args(DType::kBF16);
        g.pdl = true;
        g.weight_prefetch_bytes = 64 << 10;
        g.weights_ahead = ahead;
        if (few_ctas) g.weights_ahead_stages = 3;
        g.weights_evict_first = evict_first;
        if (evict_first) g.xq_rows = d.xq_rows;  // as served; zero-filled without the hint
        if (few_ctas) {
          g.sm_count = 4;
          g.tail_prefetch_bytes = 1 << 20;
        }
        const cutlass_sm90::TileOps* ops =
            cutlass_sm90::tile_ops(static_cast<CutlassSm90Tile>(t), g.y_type);
        ASSERT_NE(ops, nullptr);
        ASSERT_EQ(ops->prepare(), cudaSuccess);
        // Stale operands that a GEMM reading too early would use.
        ASSERT_EQ(cudaMemset(d.xq.get(), 0x5A, m * k), cudaSuccess);
        ASSERT_EQ(cudaMemset(d.sa.get(), 0x3F, m * 4), cudaSuccess);
        ASSERT_EQ(cudaMemset(d.azp.get(), 0x11, m * 4), cudaSuccess);
        ASSERT_EQ(cudaMemset(d.y.get(), 0xA5, m * n * 2), cudaSuccess);
        EXPECT_TRUE(call.matches(*ops, g, stream));
        if (HasFailure()) return;
      }
    }
  }
}

// A layer whose swapped tiles outnumber the SMs (N = 64 x (SMs + 4) channels: a last wave of four
// 64-channel tiles, whose first k-tiles the other CTAs prefetch into L2 as served): the swapped
// tiles launched as served on every SM, and on half of them (each CTA two tiles), and the layer's
// own calls as served; y bit-exact for every scheme at M = 1 and 16.
TEST_F(CutlassSm90Test, SwappedTilesOnAWideLayerMatchTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const TestStream owned;
  ASSERT_NE(owned.stream, nullptr);
  const cudaStream_t stream = owned.stream;
  const int sms = host_info().gpus[0].sm_count;
  const int64_t n = 64 * (sms + 4), k = 1040;
  for (Scheme scheme : kSchemes) {
    const auto w = make_layer(rng, scheme, n, k, /*bias=*/true);
    ASSERT_NE(w, nullptr);
    for (int64_t m : {int64_t{1}, int64_t{16}}) {
      DependentCall call;
      ASSERT_TRUE(call.init(rng, *w, m).ok());
      TileBuffers& d = call.d;
      for (int t = 0; t < kCutlassSm90Tiles; ++t) {
        const cutlass_sm90::TileOps* ops =
            cutlass_sm90::tile_ops(static_cast<CutlassSm90Tile>(t), ElemType::kBF16);
        ASSERT_NE(ops, nullptr);
        if (!ops->swaps_operands) continue;
        ASSERT_EQ(ops->prepare(), cudaSuccess);
        for (const int grid : {sms, (sms + 5) / 2}) {
          SCOPED_TRACE(absl::StrCat(scheme_name(scheme), " M ", m, " tile ", ops->name(), ", ",
                                    grid, " CTAs"));
          CutlassSm90Args g = d.args(DType::kBF16);
          g.pdl = true;
          g.weight_prefetch_bytes = 64 << 10;
          g.weights_ahead = true;
          g.weights_ahead_stages = 4;
          g.weights_evict_first = true;
          g.xq_rows = d.xq_rows;
          g.tail_prefetch_bytes = 4 << 20;
          g.sm_count = grid;
          ASSERT_EQ(cudaMemset(d.y.get(), 0xA5, m * n * 2), cudaSuccess);
          EXPECT_TRUE(call.matches(*ops, g, stream));
          if (HasFailure()) return;
        }
      }
    }
    // The load's timing is the slow part: the layer's own calls on two schemes.
    if (scheme != Scheme::kDynamicSymmetric && scheme != Scheme::kStaticAsymmetric) continue;
    const Prepared p = prepare(*kernel_, w);
    if (p.kernel == nullptr) return;
    for (int64_t m : {int64_t{1}, int64_t{16}}) {
      EXPECT_TRUE(check_call(p, make_x(rng, m, k, DType::kBF16), DType::kBF16, m, DType::kBF16));
    }
  }
}

// The swapped 16 x 64 x 256 tile on a stream-K schedule (a kernel of our own): every CTA an equal
// share of the (tile, k-tile) pairs, so that a tile is shared by up to every CTA and summed in the
// workspace, which each call leaves zeroed. y bit-exact for every scheme at M = 1, 5 and 16, after
// the quantize kernel in stream order and as its programmatic dependent (4 k-tiles of weights
// issued before the wait, every ring slot's on 7 CTAs), on 7 tiles of 17 k-tiles (a channel tail, a
// partial k-tile) and on a layer of 64 x (SMs + 4) channels, on grids of every SM, 7 and 3 CTAs,
// with the last token block's rows past M zero-filled and read from xq; the workspace all zeros at
// the end. The same kernel dealing whole tiles (tile 14, no workspace) likewise: where the tiles
// outnumber the CTAs and halves of 32 channels shorten the busiest CTA's share (400 channels, 13
// halves, on 3 CTAs; the wider layer on every grid) in halves, some CTAs' ranges starting or ending
// in a half tile (and in 2-D boxes where K = 4160 and 1040), and in one of the four runs (in stream
// order, rows read from xq) in whole tiles only, some CTAs then taking two or three tiles of
// several k-tiles one after the other; the other layers and grids in whole tiles only. The
// quantize kernel reads x from mapped pinned host memory, as a small served call's does (so it runs
// microseconds longer), and xq, sa and azp hold stale values before every call: a dependent that
// read them before its grid dependency wait, or through a path that may return stale values, fails.
TEST_F(CutlassSm90Test, StreamKSwappedTileMatchesTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const TestStream owned;
  ASSERT_NE(owned.stream, nullptr);
  const cudaStream_t stream = owned.stream;
  const int sms = host_info().gpus[0].sm_count;
  struct Case {
    int64_t n, k;
  };
  int dealt[2] = {0, 0};  // tile 14's grids dealing whole tiles only, and in halves
  for (const CutlassSm90Tile tile :
       {CutlassSm90Tile::k16x64x256StreamKSwap, CutlassSm90Tile::k16x64x256WholeSwap}) {
    const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(tile, ElemType::kBF16);
    ASSERT_NE(ops, nullptr);
    ASSERT_EQ(ops->prepare(), cudaSuccess);
    const bool shares = tile == CutlassSm90Tile::k16x64x256StreamKSwap;
    // (K = 4160 and 1040 in 2-D boxes; 4352 and 1152, multiples of 128 bytes, in 3-D boxes of a
    // whole k-tile, 1152 ending in half a k-tile; small layers of one or two k-tiles, 16 to 368
    // channels, as the serving path's small-layer tests use.)
    for (const Case c :
         {Case{400, 4160}, Case{400, 4352}, Case{64 * (sms + 4), 1040}, Case{64 * (sms + 4), 1152},
          Case{16, 80}, Case{64, 128}, Case{368, 144}, Case{176, 512}}) {
      for (Scheme scheme : kSchemes) {
        const auto w = make_layer(rng, scheme, c.n, c.k, /*bias=*/true);
        ASSERT_NE(w, nullptr);
        for (int64_t m : {int64_t{1}, int64_t{5}, int64_t{16}}) {
          DependentCall call;
          ASSERT_TRUE(call.init(rng, *w, m).ok());
          ASSERT_TRUE(call.pin_x().ok());
          TileBuffers& d = call.d;
          const size_t ws_bytes = ops->workspace_bytes(d.args(DType::kBF16));
          ASSERT_EQ(ws_bytes > 0, shares) << ops->name();
          DeviceBuffer ws;
          if (shares) {
            ASSERT_TRUE(ws.allocate(ws_bytes, "workspace").ok());
            ASSERT_EQ(cudaMemset(ws.get(), 0, ws_bytes), cudaSuccess);
          }
          for (const int grid : {sms, 7, 3}) {
            if (!shares) {
              CutlassSm90Args g = d.args(DType::kBF16);
              g.sm_count = grid;
              ++dealt[cutlass_sm90::whole_tiles_in_halves(g) ? 1 : 0];
            }
            for (int run = 0; run < 4; ++run) {
              const bool pdl = run % 2 == 1, read_rows = run >= 2;
              SCOPED_TRACE(absl::StrCat(ops->name(), ", ", scheme_name(scheme), " N ", c.n, " K ",
                                        c.k, " M ", m, ", ", grid, " CTAs",
                                        pdl ? ", dependent" : "", read_rows ? ", xq_rows" : "",
                                        run == 2 ? ", whole tiles only" : ""));
              CutlassSm90Args g = d.args(DType::kBF16);
              g.sm_count = grid;
              // Run 2 deals whole tiles only where the grid would deal halves (tile 14).
              g.half_tiles = run != 2;
              // As the dependent, 64 KB of weights prefetched into L2 before the wait.
              g.weight_prefetch_bytes = pdl ? 64 << 10 : 0;
              g.pdl = pdl;
              g.weights_ahead = true;
              // Every ring slot's weights ahead of the wait on the 7-CTA grid, 4 elsewhere.
              g.weights_ahead_stages = grid == 7 ? 0 : 4;
              if (read_rows) g.xq_rows = d.xq_rows;
              ASSERT_LE(ops->workspace_bytes(g), ws_bytes);
              ASSERT_TRUE(call.poison().ok());
              ASSERT_EQ(cudaMemset(d.y.get(), 0xA5, m * c.n * 2), cudaSuccess);
              EXPECT_TRUE(call.matches(*ops, g, stream, ws.get()));
              if (HasFailure()) return;
            }
          }
          if (!shares) continue;
          std::vector<uint64_t> words(ws_bytes / 8, 1);
          ASSERT_EQ(cudaMemcpy(words.data(), ws.get(), ws_bytes, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          EXPECT_EQ(std::count(words.begin(), words.end(), uint64_t{0}),
                    static_cast<int64_t>(words.size()));
        }
      }
    }
  }
  EXPECT_GT(dealt[0], 0) << "tile 14 never dealt whole tiles only";
  EXPECT_GT(dealt[1], 0) << "tile 14 never dealt halves";
}

// The swapped tiles whose CTAs claim their tiles at run time from a counter
// (cutlass_sm90_claiming_scheduler.cuh): y bit-exact for every scheme at M = 1 and 16, after the
// quantize kernel in stream order and as its programmatic dependent (4 k-tiles of weights issued
// before the wait), the next tile drawn 0, 1 or 3 k-tiles before the end of a tile's loads, and on
// the static deal without a counter; with the weights' loads in the mainloop's own loop and in
// CUTLASS's (which the claim signal precedes); on 7 tiles of 17 k-tiles (a channel tail, a partial
// k-tile) and on a layer of 64 x (3 x SMs + 5) channels (every CTA drawing three or four tiles), on
// grids of every SM and of 3 CTAs; the workspace (the counter, the claim signals) back at zeros
// after every call. And as served: the workspace holding garbage that the quantize kernel zeroes
// before the GEMM, its programmatic dependent, draws.
TEST_F(CutlassSm90Test, ClaimingSwappedTilesMatchTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const TestStream owned;
  ASSERT_NE(owned.stream, nullptr);
  const cudaStream_t stream = owned.stream;
  const int sms = host_info().gpus[0].sm_count;
  struct Case {
    int64_t n, k;
  };
  for (const CutlassSm90Tile tile :
       {CutlassSm90Tile::k16x64x256ClaimSwap, CutlassSm90Tile::k16x64x512ClaimSwap}) {
    const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(tile, ElemType::kBF16);
    ASSERT_NE(ops, nullptr);
    ASSERT_EQ(ops->prepare(), cudaSuccess);
    for (const Case c : {Case{400, 4160}, Case{64 * (3 * sms + 5), 1040}}) {
      for (Scheme scheme : kSchemes) {
        const auto w = make_layer(rng, scheme, c.n, c.k, /*bias=*/true);
        ASSERT_NE(w, nullptr);
        for (int64_t m : {int64_t{1}, int64_t{16}}) {
          DependentCall call;
          ASSERT_TRUE(call.init(rng, *w, m).ok());
          TileBuffers& d = call.d;
          const size_t ws_bytes = ops->workspace_bytes(d.args(DType::kBF16));
          ASSERT_GT(ws_bytes, 0u);
          DeviceBuffer ws;
          ASSERT_TRUE(ws.allocate(ws_bytes, "workspace").ok());
          ASSERT_EQ(cudaMemset(ws.get(), 0, ws_bytes), cudaSuccess);
          for (const int grid : {sms, 3}) {
            for (const int lead : {-1, 0, 1, 3}) {  // -1: the static deal
              for (const bool pdl : {false, true}) {
                const bool own_loop = lead != 1;
                SCOPED_TRACE(absl::StrCat(scheme_name(scheme), " tile ", ops->name(), " N ", c.n,
                                          " K ", c.k, " M ", m, ", ", grid, " CTAs, lead ", lead,
                                          pdl ? ", dependent" : "",
                                          own_loop ? "" : ", CUTLASS's loads"));
                CutlassSm90Args g = d.args(DType::kBF16);
                g.sm_count = grid;
                g.pdl = pdl;
                g.weight_prefetch_bytes = pdl ? 64 << 10 : 0;
                g.weights_ahead = true;
                g.weights_ahead_stages = 4;
                g.weights_evict_first = own_loop;
                if (own_loop) g.xq_rows = d.xq_rows;  // as served; zero-filled otherwise
                g.tail_prefetch_bytes = 4 << 20;
                g.claim_lead = lead < 0 ? 0 : lead;
                ASSERT_LE(ops->workspace_bytes(g), ws_bytes);
                ASSERT_EQ(cudaMemset(d.y.get(), 0xA5, m * c.n * 2), cudaSuccess);
                EXPECT_TRUE(call.matches(*ops, g, stream, lead < 0 ? nullptr : ws.get()));
                std::vector<uint8_t> counter(ws_bytes, 1);
                ASSERT_EQ(cudaMemcpy(counter.data(), ws.get(), ws_bytes, cudaMemcpyDeviceToHost),
                          cudaSuccess);
                EXPECT_EQ(std::count(counter.begin(), counter.end(), uint8_t{0}),
                          static_cast<int64_t>(ws_bytes));
                if (HasFailure()) return;
              }
            }
          }
          SCOPED_TRACE(absl::StrCat(scheme_name(scheme), " tile ", ops->name(), " N ", c.n, " K ",
                                    c.k, " M ", m, ", as served, the workspace zeroed first"));
          CutlassSm90Args g = d.args(DType::kBF16);
          g.sm_count = sms;
          g.pdl = true;
          g.weight_prefetch_bytes = 64 << 10;
          g.weights_ahead = true;
          g.weights_ahead_stages = 4;
          g.weights_evict_first = true;
          g.xq_rows = d.xq_rows;
          g.tail_prefetch_bytes = 4 << 20;
          g.claim_lead = 0;
          ASSERT_EQ(cudaMemset(ws.get(), 0x7F, ws_bytes), cudaSuccess);
          ASSERT_EQ(cudaMemset(d.y.get(), 0xA5, m * c.n * 2), cudaSuccess);
          EXPECT_TRUE(call.matches(*ops, g, stream, ws.get(), static_cast<int32_t*>(ws.get()),
                                   static_cast<int64_t>(ws_bytes / 4)));
          if (HasFailure()) return;
        }
      }
    }
  }
}

// The shape of a quantizing tiles' test case.
struct QuantizingCase {
  int64_t m, n, k;
};

// The quantizing tiles' differential check, through the device entry point on 16-bit x: for each
// case and scheme (bias, x and y types taking turns), a layer and x whose rows bad_rows(m) (drawn
// after the reference) turn non-finite on the device (a NaN at element nan_at of the first, `inf`
// at the last element of the second), then both quantizing tiles launched once per form, form(g,
// f) setting form f on the arguments and naming it; y, sa, xq and the counters start as garbage
// before every launch. The non-finite rows get sa = NaN, every other row y and sa bit-exact.
void check_quantizing_tiles(SplitMix64& rng, std::initializer_list<QuantizingCase> cases,
                            const std::function<std::array<int64_t, 2>(int64_t)>& bad_rows,
                            int64_t nan_at, float inf, std::initializer_list<int64_t> forms,
                            const std::function<std::string(CutlassSm90Args&, int64_t)>& form) {
  int round = 0;
  for (const QuantizingCase& cs : cases) {
    const int64_t m = cs.m, n = cs.n, k = cs.k;
    for (Scheme scheme : kSchemes) {
      ++round;
      const bool bias = round % 2 == 0;
      const DType xt = round % 3 == 0 ? DType::kF16 : DType::kBF16;
      const DType yt = kDTypes[round % 3];
      const auto w = make_layer(rng, scheme, n, k, bias);
      ASSERT_NE(w, nullptr);
      const std::vector<uint8_t> x = make_x(rng, m, k, xt);
      const Expected want = reference_run(*w, x.data(), xt, m, yt);
      ASSERT_TRUE(want.status.ok());
      const std::array<int64_t, 2> bad = bad_rows(m);
      std::vector<uint8_t> xd = x;
      store_from_f32(xd.data(), xt, static_cast<size_t>(bad[0] * k + nan_at), std::nanf(""));
      store_from_f32(xd.data(), xt, static_cast<size_t>(bad[1] * k + k - 1), inf);
      TileBuffers d;
      ASSERT_TRUE(d.init(*w, m).ok());
      ASSERT_TRUE(d.upload_bias(*w, yt).ok());
      DeviceBuffer d_x, d_counters;
      ASSERT_TRUE(d_x.allocate(xd.size(), "x").ok());
      ASSERT_TRUE(d_counters.allocate(quantizing_tile_counters(m) * 4, "counters").ok());
      ASSERT_EQ(cudaMemcpy(d_x.get(), xd.data(), xd.size(), cudaMemcpyHostToDevice), cudaSuccess);
      for (CutlassSm90Tile tile :
           {CutlassSm90Tile::k128x128x128PingpongQ, CutlassSm90Tile::k64x256x128PingpongQ}) {
        for (int64_t f : forms) {
          CutlassSm90Args g = d.args(yt);
          g.x = d_x.get();
          g.x_type = static_cast<ElemType>(xt);
          g.qp = quantize_params(w->config);
          g.counters = d_counters.as<int32_t>();
          const std::string what =
              absl::StrCat(scheme_name(scheme), bias ? " bias" : " no-bias", " x ", dtype_name(xt),
                           " y ", dtype_name(yt), " ", m, "x", n, "x", k, " tile ",
                           static_cast<int>(tile), " ", form(g, f));
          const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(tile, g.y_type);
          ASSERT_NE(ops, nullptr);
          ASSERT_EQ(ops->prepare(), cudaSuccess);
          ASSERT_TRUE(ops->can_implement(g)) << what;
          ASSERT_EQ(cudaMemset(d.y.get(), 0xA5, m * n * 4), cudaSuccess);
          ASSERT_EQ(cudaMemset(d.sa.get(), 0xA5, m * 4), cudaSuccess);
          ASSERT_EQ(cudaMemset(d.xq.get(), 0x81, static_cast<size_t>(d.xq_rows * k)), cudaSuccess);
          ASSERT_EQ(cudaMemset(d_counters.get(), 0xA5, d_counters.size()), cudaSuccess);
          ASSERT_EQ(ops->launch(g, nullptr, nullptr), cudaSuccess) << what;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          std::vector<uint8_t> y(m * n * dtype_size(yt));
          std::vector<float> sa(m);
          ASSERT_EQ(cudaMemcpy(y.data(), d.y.get(), y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(sa.data(), d.sa.get(), m * 4, cudaMemcpyDeviceToHost), cudaSuccess);
          for (int64_t r = 0; r < m; ++r) {
            if (r == bad[0] || r == bad[1]) {
              EXPECT_TRUE(std::isnan(sa[r])) << what << ": row " << r << " is not flagged";
              continue;
            }
            ASSERT_EQ(std::memcmp(&sa[r], &want.sa[r], 4), 0)
                << what << ": sa row " << r << " want " << want.sa[r] << " got " << sa[r];
            ASSERT_EQ(y_row_mismatch(want.y, y, r, n, yt), "") << what;
          }
        }
      }
    }
  }
}

// The quantizing tiles (activations quantized inside the GEMM launch), with the quantize kernel
// doing 1 row, 129 rows or the tile's own choice and the GEMM's auxiliary warps the rest (after 1
// or 129 rows their claims of kAuxClaimRows straddle m-blocks); rows of 1 to 4 ring slots (k =
// 16384 fills the ring with one row); a NaN and an Inf row among those the GEMM quantizes
// (check_quantizing_tiles).
TEST_F(CutlassSm90Test, QuantizingTilesMatchTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t m0 = 1000 + rng.range(0, 200), m1 = 700 + rng.range(0, 100),
                m2 = 300 + rng.range(0, 50);
  check_quantizing_tiles(
      rng, {{m0, 400, 336}, {m1, 272, 8192}, {m2, 144, 16384}},
      [&](int64_t m) {
        return std::array<int64_t, 2>{m - 3, 200 + rng.range(0, 50)};
      },
      7, INFINITY, {1, 129, -1},
      [](CutlassSm90Args& g, int64_t prefix) {
        g.prefix = prefix;
        return absl::StrCat("prefix ", prefix);
      });
}

// The quantizing tiles with every row quantized in the GEMM's set-up (prefix 0: every tile in the
// grid's first wave, each CTA quantizing its own unit of rows with all its threads before its
// roles start), for every scheme, bf16 and fp16 x, every output type; units of 6 and 12 rows (the
// last one partial), of 3 or 4 rows, of 1 or 2 rows of 28672 values and of 1 row of 49152 (rows
// the ring could not hold), a NaN and an Inf row; with every unit owned by a CTA, only the first,
// and none (the auxiliary warps' fallback takes the others after its wait)
// (check_quantizing_tiles).
TEST_F(CutlassSm90Test, QuantizingTilesInTheSetUpMatchTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  // (Both tiles take each case in the set-up: 128 x 128 with 6, 3 or 4, 1 and 1 rows per unit,
  // 64 x 256 with 12, 3 or 4, 2 or 1, and 1; m % 12 == 1 in the first case.)
  const int64_t m0 = 145 + 12 * rng.range(0, 3), m1 = 129 + rng.range(0, 127),
                m2 = 10 + rng.range(0, 9), m3 = 6 + rng.range(0, 7);
  check_quantizing_tiles(
      rng, {{m0, 2048, 4096}, {m1, 4096, 2048}, {m2, 4096, 28672}, {m3, 4096, 49152}},
      [&](int64_t m) {
        return std::array<int64_t, 2>{m - 1 - rng.range(0, 2), rng.range(0, 4)};
      },
      5, -INFINITY, {-1, 1, 0},
      [](CutlassSm90Args& g, int64_t owned) {
        g.prefix = 0;
        g.prologue_owned_units = owned;
        return absl::StrCat("owned units ", owned);
      });
}

// Tile 15, the whole-tile kernel quantizing the activations inside its launch: y bit-exact with
// the reference, and sa and azp with the quantize kernel's on the same x, for every scheme, bf16
// and fp16 x and every output type; M from 1 to 16 as far as its shared memory takes the rows
// (m * K <= 10240), on layers of one or two k-tiles, a channel tail with a partial k-tile (K =
// 4160), 64 x (SMs + 4) channels (CTAs taking two or three halves of 32 channels, some starting
// or ending in a half tile) and K = 10240 at M = 1, on every SM and on 3 CTAs (a launch deals
// halves where the tiles outnumber the CTAs and halves shorten the busiest CTA's share, and runs
// again dealing whole tiles only; both deals are checked to occur); among the rows a constant one
// (dynamic asymmetric: a zero row), an all-zero one and one with a NaN (sa NaN, azp left as it was,
// every other row exact).
TEST_F(CutlassSm90Test, QuantizingWholeTileMatchesTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const TestStream owned;
  ASSERT_NE(owned.stream, nullptr);
  const cudaStream_t stream = owned.stream;
  const int sms = host_info().gpus[0].sm_count;
  struct Case {
    int64_t n, k;
    std::vector<int64_t> ms;
  };
  const Case cases[] = {{16, 80, {1, 2, 16}}, {368, 144, {1, 5, 16}},
                        {400, 4160, {1, 2}},  {64 * (sms + 4), 1152, {1, 8}},
                        {176, 10240, {1}},    {272, 512, {7, 16}}};
  const cutlass_sm90::TileOps* ops =
      cutlass_sm90::tile_ops(CutlassSm90Tile::k16x64x256WholeSwapQ, ElemType::kBF16);
  ASSERT_NE(ops, nullptr);
  ASSERT_EQ(ops->prepare(), cudaSuccess);
  int round = 0;
  int dealt[2] = {0, 0};  // launches dealing whole tiles only, and in halves
  for (const Case& cs : cases) {
    const int64_t n = cs.n, k = cs.k;
    for (Scheme scheme : kSchemes) {
      for (const int64_t m : cs.ms) {
        ++round;
        const bool bias = round % 2 == 0;
        const DType xt = round % 3 == 0 ? DType::kF16 : DType::kBF16;
        const DType yt = kDTypes[round % 3];
        const auto w = make_layer(rng, scheme, n, k, bias);
        ASSERT_NE(w, nullptr);
        std::vector<uint8_t> x = make_x(rng, m, k, xt);
        for (int64_t i = 0; i < k && m > 1; ++i) store_from_f32(x.data(), xt, k + i, 0.5f);
        for (int64_t i = 0; i < k && m > 2; ++i) store_from_f32(x.data(), xt, 2 * k + i, 0.f);
        const Expected want = reference_run(*w, x.data(), xt, m, yt);
        ASSERT_TRUE(want.status.ok());
        const int64_t bad = m > 3 ? 3 : -1;  // turns NaN on the device
        if (bad >= 0) store_from_f32(x.data(), xt, static_cast<size_t>(bad * k + k / 2), NAN);
        TileBuffers d;
        ASSERT_TRUE(d.init(*w, m).ok());
        ASSERT_TRUE(d.upload_bias(*w, yt).ok());
        DeviceBuffer d_x, q_xq, q_sa, q_azp;
        ASSERT_TRUE(d_x.allocate(x.size(), "x").ok());
        ASSERT_TRUE(q_xq.allocate(static_cast<size_t>(m * k), "xq").ok());
        ASSERT_TRUE(q_sa.allocate(static_cast<size_t>(m * 4), "sa").ok());
        ASSERT_TRUE(q_azp.allocate(static_cast<size_t>(m * 4), "azp").ok());
        ASSERT_EQ(cudaMemcpy(d_x.get(), x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
        // The quantize kernel's sa and azp on the same x (azp poisoned as the tile's is).
        ASSERT_EQ(cudaMemset(q_azp.get(), 0x11, m * 4), cudaSuccess);
        const QuantizeParams qp = quantize_params(w->config);
        ASSERT_EQ(
            launch_quantize_s8(d_x.get(), static_cast<ElemType>(xt), m, k, qp, q_xq.as<int8_t>(),
                               q_sa.as<float>(), q_azp.as<int32_t>(), stream, nullptr, 0),
            cudaSuccess);
        std::vector<float> want_sa(m);
        std::vector<int32_t> want_azp(m);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(want_sa.data(), q_sa.get(), m * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy(want_azp.data(), q_azp.get(), m * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        for (const int grid : {sms, 3}) {
          for (const bool halves : {true, false}) {
            const std::string what =
                absl::StrCat(scheme_name(scheme), bias ? " bias" : " no-bias", " x ",
                             dtype_name(xt), " y ", dtype_name(yt), " M ", m, " N ", n, " K ", k,
                             ", ", grid, " CTAs", halves ? "" : ", whole tiles only");
            SCOPED_TRACE(what);
            CutlassSm90Args g = d.args(yt);
            g.x = d_x.get();
            g.x_type = static_cast<ElemType>(xt);
            g.qp = qp;
            g.sm_count = grid;
            g.xq = nullptr;  // not read
            // Where the grid deals halves, once more dealing whole tiles only.
            if (!halves && !cutlass_sm90::whole_tiles_in_halves(g)) continue;
            g.half_tiles = halves;
            ASSERT_TRUE(ops->can_implement(g));
            ++dealt[cutlass_sm90::whole_tiles_in_halves(g) ? 1 : 0];
            ASSERT_EQ(cudaMemset(d.y.get(), 0xA5, m * n * 4), cudaSuccess);
            ASSERT_EQ(cudaMemset(d.sa.get(), 0xA5, m * 4), cudaSuccess);
            ASSERT_EQ(cudaMemset(d.azp.get(), 0x11, m * 4), cudaSuccess);
            ASSERT_EQ(ops->launch(g, nullptr, stream), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            std::vector<uint8_t> y(m * n * dtype_size(yt));
            std::vector<float> sa(m);
            std::vector<int32_t> azp(m);
            ASSERT_EQ(cudaMemcpy(y.data(), d.y.get(), y.size(), cudaMemcpyDeviceToHost),
                      cudaSuccess);
            ASSERT_EQ(cudaMemcpy(sa.data(), d.sa.get(), m * 4, cudaMemcpyDeviceToHost),
                      cudaSuccess);
            ASSERT_EQ(cudaMemcpy(azp.data(), d.azp.get(), m * 4, cudaMemcpyDeviceToHost),
                      cudaSuccess);
            for (int64_t r = 0; r < m; ++r) {
              ASSERT_EQ(std::memcmp(&sa[r], &want_sa[r], 4), 0)
                  << "sa row " << r << " want " << want_sa[r] << " got " << sa[r];
              ASSERT_EQ(azp[r], want_azp[r]) << "azp row " << r;
              if (r == bad) {
                EXPECT_TRUE(std::isnan(sa[r])) << "row " << r << " is not flagged";
                continue;
              }
              ASSERT_EQ(std::memcmp(&sa[r], &want.sa[r], 4), 0) << "sa row " << r;
              ASSERT_EQ(y_row_mismatch(want.y, y, r, n, yt), "");
            }
          }
        }
      }
    }
  }
  EXPECT_GT(dealt[0], 0) << "no launch dealt whole tiles only";
  EXPECT_GT(dealt[1], 0) << "no launch dealt halves";
  // What it declines: another tile then takes the call.
  DeviceBuffer x, sa;
  ASSERT_TRUE(x.allocate(2 * 10240 * 2 + 64, "x").ok());
  ASSERT_TRUE(sa.allocate(64, "sa").ok());
  CutlassSm90Args g;
  g.m = 1;
  g.n = 256;
  g.k = 10240;
  g.w = static_cast<const int8_t*>(x.get());
  g.x = x.get();
  g.sa = sa.as<float>();
  g.sm_count = sms;
  EXPECT_TRUE(ops->can_implement(g));
  CutlassSm90Args f = g;
  f.m = 2;
  EXPECT_FALSE(ops->can_implement(f)) << "rows past its shared memory";
  f = g;
  f.k = 10240 + 16;
  EXPECT_FALSE(ops->can_implement(f)) << "a row past its shared memory";
  f = g;
  f.x_type = ElemType::kF32;
  EXPECT_FALSE(ops->can_implement(f)) << "fp32 activations";
  f = g;
  f.x = static_cast<const char*>(g.x) + 8;
  EXPECT_FALSE(ops->can_implement(f)) << "x not 16-byte aligned";
  f = g;
  f.x = nullptr;
  EXPECT_FALSE(ops->can_implement(f)) << "no activations";
  EXPECT_EQ(ops->launch(f, nullptr, nullptr), cudaErrorInvalidValue);
}

// A layer's device path (run_device: x, y, sa and azp in device memory, as a caller holding its
// activations on the GPU runs it) at M = 1, 4 and 16, whichever tile the load timed fastest (tile
// 15 where it won: the whole op in one launch), and the same calls with x in mapped pinned host
// memory (x_in_host_memory: tile 15 then gives way to the fastest other tile); y, sa and azp bit-
// exact with the reference each time. Each M's choice is printed. Then again with tile 15 forced
// on every call (set_cutlass_sm90_forced_tile), whatever the load timed, and each call also
// through the serving path (run, on host buffers).
TEST_F(CutlassSm90Test, DevicePathMatchesTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const TestStream owned;
  ASSERT_NE(owned.stream, nullptr);
  const cudaStream_t stream = owned.stream;
  // With the layer's own tiles, then with tile 15 (the whole op in one launch) on every call: x
  // in device memory up to 20 KB of rows (M = 1 and 4 here), another tile past that (M = 16) and
  // where x is in pinned host memory.
  struct ResetForcedTile {
    ~ResetForcedTile() { set_cutlass_sm90_forced_tile(-1); }
  } reset;
  for (const int forced : {-1, static_cast<int>(CutlassSm90Tile::k16x64x256WholeSwapQ)}) {
    set_cutlass_sm90_forced_tile(forced);
    SCOPED_TRACE(forced < 0 ? "the layer's tiles" : "tile 15 forced");
    for (Scheme scheme : {Scheme::kDynamicSymmetric, Scheme::kDynamicAsymmetric}) {
      const int64_t n = 1024, k = 1024;
      const auto w = make_layer(rng, scheme, n, k, /*bias=*/true);
      ASSERT_NE(w, nullptr);
      const Prepared p = prepare(*kernel_, w);
      if (p.kernel == nullptr) return;
      for (const int64_t m : {int64_t{1}, int64_t{4}, int64_t{16}}) {
        const std::vector<uint8_t> x = make_x(rng, m, k, DType::kBF16);
        const Expected want = reference_run(*w, x.data(), DType::kBF16, m, DType::kBF16);
        ASSERT_TRUE(want.status.ok());
        std::printf("  %s M=%lld: %s\n", std::string(scheme_name(scheme)).c_str(),
                    static_cast<long long>(m), p.kernel->variant(m).c_str());
        if (forced >= 0) {
          if (m * k * 2 <= 20480) {
            EXPECT_TRUE(absl::StrContains(p.kernel->variant(m), "quantized in the GEMM launch"))
                << p.kernel->variant(m);
          }
          // Through the serving path too: x then stays in pinned host memory.
          EXPECT_TRUE(check_run(p, x, DType::kBF16, m, DType::kBF16));
        }
        DeviceBuffer d_x, d_y, d_sa, d_azp, scratch;
        PinnedBuffer h_x;
        ASSERT_TRUE(d_x.allocate(x.size(), "x").ok());
        ASSERT_TRUE(h_x.reserve(x.size(), "x").ok());
        ASSERT_NE(h_x.device_alias(), nullptr);
        ASSERT_TRUE(d_y.allocate(static_cast<size_t>(m * n * 2), "y").ok());
        ASSERT_TRUE(d_sa.allocate(static_cast<size_t>(m * 4), "sa").ok());
        ASSERT_TRUE(d_azp.allocate(static_cast<size_t>(m * 4), "azp").ok());
        ASSERT_TRUE(scratch.allocate(p.kernel->device_scratch_bytes(m), "scratch").ok());
        ASSERT_EQ(cudaMemcpy(d_x.get(), x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
        std::memcpy(h_x.get(), x.data(), x.size());
        for (const bool pinned : {false, true}) {
          SCOPED_TRACE(absl::StrCat(scheme_name(scheme), " M ", m,
                                    pinned ? ", x in pinned host memory" : ", x in device memory"));
          DeviceRunArgs a;
          a.x = pinned ? h_x.device_alias() : d_x.get();
          a.x_in_host_memory = pinned;
          a.x_dtype = DType::kBF16;
          a.m = m;
          a.y = d_y.get();
          a.y_dtype = DType::kBF16;
          a.sa = d_sa.as<float>();
          a.azp = d_azp.as<int32_t>();
          ASSERT_EQ(cudaMemset(d_y.get(), 0xA5, d_y.size()), cudaSuccess);
          ASSERT_EQ(cudaMemset(d_sa.get(), 0xA5, d_sa.size()), cudaSuccess);
          ASSERT_EQ(cudaMemset(d_azp.get(), 0x11, d_azp.size()), cudaSuccess);
          ASSERT_TRUE(p.kernel->run_device(a, scratch.get(), stream, nullptr).ok());
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          std::vector<uint8_t> y(d_y.size());
          std::vector<float> sa(m);
          std::vector<int32_t> azp(m);
          ASSERT_EQ(cudaMemcpy(y.data(), d_y.get(), y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(sa.data(), d_sa.get(), m * 4, cudaMemcpyDeviceToHost), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(azp.data(), d_azp.get(), m * 4, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          if (int64_t i = first_y_mismatch(want.y, y, DType::kBF16); i >= 0) {
            ADD_FAILURE() << "y differs at row " << i / n << " col " << i % n << ": want "
                          << load_as_f32(want.y.data(), DType::kBF16, i) << " got "
                          << load_as_f32(y.data(), DType::kBF16, i);
          }
          EXPECT_EQ(first_mismatch(want.sa, sa), -1) << "sa";
          if (is_asymmetric(scheme)) {
            EXPECT_EQ(first_mismatch(want.azp, azp), -1) << "azp";
          }
          if (HasFailure()) return;
        }
      }
    }
  }
}

// The quantizing tiles decline what they cannot take, so that the layer uses the plain tiles.
TEST_F(CutlassSm90Test, QuantizingTilesDeclineWhatTheyCannotTake) {
  DeviceBuffer x, counters;
  ASSERT_TRUE(x.allocate(1024 * 32768, "x").ok());
  ASSERT_TRUE(counters.allocate(64, "counters").ok());
  CutlassSm90Args g;
  g.m = 1024;
  g.n = 256;
  g.k = 4096;
  g.sm_count = host_info().gpus[0].sm_count;
  g.x = x.get();
  g.counters = counters.as<int32_t>();
  const cutlass_sm90::TileOps* ops =
      cutlass_sm90::tile_ops(CutlassSm90Tile::k128x128x128PingpongQ, ElemType::kBF16);
  ASSERT_NE(ops, nullptr);
  EXPECT_TRUE(ops->can_implement(g));
  CutlassSm90Args f = g;
  f.x_type = ElemType::kF32;
  EXPECT_FALSE(ops->can_implement(f)) << "fp32 activations";
  f = g;
  f.x = static_cast<const char*>(g.x) + 8;
  EXPECT_FALSE(ops->can_implement(f)) << "x not 16-byte aligned";
  f = g;
  f.k = kAuxRingBytes / 2 + 16;
  EXPECT_FALSE(ops->can_implement(f)) << "a row longer than the ring";
  f = g;
  f.x = nullptr;
  EXPECT_FALSE(ops->can_implement(f)) << "no activations";
  EXPECT_EQ(ops->launch(f, nullptr, nullptr), cudaErrorInvalidValue);
  // Every row in the GEMM's set-up (prefix 0): only while every tile lies in the first wave and a
  // unit's rows fit the CTA's threads.
  f = g;
  f.prefix = 0;
  EXPECT_FALSE(ops->can_implement(f)) << "the set-up with 1024 rows on 16 tiles";
  EXPECT_EQ(ops->launch(f, nullptr, nullptr), cudaErrorInvalidValue);
  f.m = 192;
  f.n = 1024;
  EXPECT_TRUE(ops->can_implement(f)) << "the set-up with units of 12 rows of 4096 values";
  f.k = 8192;
  EXPECT_FALSE(ops->can_implement(f)) << "the set-up with units of 12 rows of 8192 values";
  f.m = 16;
  f.k = 65536;
  EXPECT_FALSE(ops->can_implement(f)) << "the set-up with a row of 65536 values";
  f.k = 49152;
  EXPECT_TRUE(ops->can_implement(f)) << "the set-up with a row of 49152 values";
  f.n = 256 * 132;
  EXPECT_FALSE(ops->can_implement(f)) << "the set-up with tiles past one wave";
}

#endif  // QLINEAR_HAVE_CUTLASS

// --- What runs without a GPU --------------------------------------------------------------

TEST(CutlassSm90Kernel, SaysWhetherItIsCompiledIn) {
  auto k = make_cutlass_sm90_kernel();
  EXPECT_EQ(k->name(), "cuda.cutlass_sm90");
  HostInfo h;
  h.cuda_compiled = true;
  h.gpus.push_back(GpuInfo{0, "Fake H100", 9, 0, int64_t{80} << 30, 132});
  const absl::Status s = k->is_supported(h);
  if (cutlass_sm90_compiled_in()) {
    // Compiled in: a build whose architectures run on sm_90 takes the fake H100.
    EXPECT_EQ(s.ok(), check_cuda_arch(compiled_cuda_archs(), 9, 0).ok()) << s.message();
  } else {
    EXPECT_TRUE(absl::StartsWith(s.message(), "not compiled in")) << s.message();
  }
  h.gpus[0].cc_major = 10;
  EXPECT_EQ(k->is_supported(h).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CutlassSm90Kernel, DeclinesUnalignedShapes) {
  auto k = make_cutlass_sm90_kernel();
  LayerConfig c;
  c.n = 64;
  c.k = 100;
  EXPECT_EQ(k->can_implement(c, ProblemShape{2048, 64, 100, DType::kBF16, DType::kBF16}).message(),
            "K=100 is not a multiple of 16 (TMA needs 16-byte rows)");
  c.k = 128;
  c.n = 72;
  EXPECT_EQ(k->can_implement(c, ProblemShape{2048, 72, 128, DType::kBF16, DType::kBF16}).message(),
            "N=72 is not a multiple of 16 (TMA needs 16-byte rows)");
  c.n = 64;
  EXPECT_TRUE(k->can_implement(c, ProblemShape{2048, 64, 128, DType::kF32, DType::kF16}).ok());
  // Every M bucket (measured on the H200: ahead of or level with cuda.cublaslt at every M).
  EXPECT_EQ(k->preferred_m().min, 1);
  EXPECT_EQ(k->preferred_m().max, std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace qlinear::gpu::testing
