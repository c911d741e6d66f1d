// cuda.stream_s8 beyond the shared fused-kernel tests (gemv_s8_test.cc): shapes whose work units
// end mid-chunk and mid-row-block (K % 512 and N % 64 awkward, K % 32 == 16), one row block
// shared by dozens of blocks (long K, narrow N), every scheme at M = 1..32, and the launch entry
// point at grids from 1 block to more blocks than units, accumulators checked exactly, with the
// quantize kernel first and quantizing inside the kernel (fused).
#include "kernels/cuda/stream_s8.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "kernels/core/tuning_cache.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/stream_s8_device.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace qlinear::gpu::testing {
namespace {

class StreamS8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    QLINEAR_REQUIRE_GPU();
    kernel_ = make_stream_s8_kernel();
    const absl::Status s = kernel_->is_supported(host_info());
    if (!s.ok()) GTEST_SKIP() << "cuda.stream_s8 cannot run here: " << s.message();
  }
  std::unique_ptr<Kernel> kernel_;
};

TEST_F(StreamS8Test, AwkwardShapesMatchTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  struct Shape {
    int64_t n, k;
  };
  // 1040 x 1552: a 16-row last row block, a 16-byte last chunk. 64 x 28672: one row block over
  // 56 blocks (64 x 14336: over 28, quantizing inside the kernel at M = 1). 4112 x 5136: both,
  // with ranges ending mid-chunk. 176 x 48: fewer units than SMs.
  const Shape shapes[] = {{1040, 1552}, {64, 28672}, {64, 14336}, {4112, 5136}, {176, 48}};
  int combo = 0;
  for (const Shape& s : shapes) {
    for (Scheme scheme : kSchemes) {
      const Prepared p = prepare(*kernel_, make_layer(rng, scheme, s.n, s.k, combo % 2 == 0));
      if (p.kernel == nullptr) return;
      for (int64_t m : {1, 2, 7, 8, 9, 16, 17, 31, 32}) {
        const DType xt = kDTypes[combo % 3], yt = kDTypes[(combo / 3) % 3];
        ++combo;
        EXPECT_TRUE(check_call(p, make_x(rng, m, s.k, xt), xt, m, yt))
            << s.n << " x " << s.k << " M=" << m;
      }
    }
  }
}

// The int32 sums of xq [m, k] times w [n, k] transposed, on the host.
std::vector<int32_t> host_gemm(const std::vector<int8_t>& xq, const std::vector<int8_t>& w,
                               int64_t m, int64_t n, int64_t k) {
  std::vector<int32_t> sums(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      int32_t s = 0;
      for (int64_t e = 0; e < k; ++e) s += int32_t{xq[i * k + e]} * int32_t{w[j * k + e]};
      sums[static_cast<size_t>(i * n + j)] = s;
    }
  }
  return sums;
}

// Where row i's element e of m rows lies in the kernel's activation layout (stream_xq_layout).
size_t blocked_at(int64_t m, int64_t i, int64_t e) {
  const XqLayout lay = stream_xq_layout(m);
  return static_cast<size_t>((e / lay.chunk) * lay.chunk_stride + i * lay.row_stride +
                             e % lay.chunk);
}

// A launch on m x n x k whose y is fp32 and whose int32 accumulators land in acc, for checking
// them exactly; the activations' side (xq and sa, or fused x) is the caller's.
StreamS8Args acc_launch(const DeviceBuffer& w, const DeviceBuffer& sb, const DeviceBuffer& y,
                        const DeviceBuffer& acc, const DeviceBuffer& partials, int64_t m, int64_t n,
                        int64_t k, int grid) {
  StreamS8Args a;
  EXPECT_EQ(stream_s8_weights_map(w.as<int8_t>(), n, k, &a.w_map), cudaSuccess);
  a.m = m;
  a.n = n;
  a.k = k;
  a.w = w.as<int8_t>();
  a.sb = sb.as<float>();
  a.y = y.get();
  a.y_type = ElemType::kF32;
  a.acc = acc.as<int32_t>();
  a.partials = partials.as<int32_t>();
  a.grid = grid;
  return a;
}

// The launch entry point with every kind of grid: the row blocks split among blocks however the
// ranges fall (whole, in two, among dozens), the partial sums reduced exactly (acc against a host
// int32 GEMM of the same xq).
TEST_F(StreamS8Test, EveryGridSumsExactly) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t n = 1040, k = 3088;  // 17 row blocks (the last 16 rows), 7 chunks (the last 16 B)
  const int64_t units = 17 * 7;
  std::vector<int8_t> w(static_cast<size_t>(n * k));
  for (int8_t& v : w) v = static_cast<int8_t>(rng.range(-128, 127));
  std::vector<float> ones(static_cast<size_t>(std::max(n, kStreamMaxM)), 1.f);
  const int max_grid = static_cast<int>(units) + 5;
  DeviceBuffer dw, dxq, dsb, dsa, dy, dacc, dcnt, dpart;
  ASSERT_TRUE(dw.allocate(w.size(), "w").ok());
  ASSERT_TRUE(dxq.allocate(stream_xq_bytes(kStreamMaxM, k), "xq").ok());
  ASSERT_TRUE(dsb.allocate(static_cast<size_t>(n) * 4, "sb").ok());
  ASSERT_TRUE(dsa.allocate(kStreamMaxM * 4, "sa").ok());
  ASSERT_TRUE(dy.allocate(static_cast<size_t>(kStreamMaxM * n) * 4, "y").ok());
  ASSERT_TRUE(dacc.allocate(static_cast<size_t>(kStreamMaxM * n) * 4, "acc").ok());
  ASSERT_TRUE(dcnt.allocate(static_cast<size_t>(stream_s8_counters(n)) * 4, "counters").ok());
  ASSERT_TRUE(dpart.allocate(stream_s8_partials_bytes(max_grid, kStreamMaxM), "partials").ok());
  ASSERT_EQ(cudaMemcpy(dw.get(), w.data(), w.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dsb.get(), ones.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dsa.get(), ones.data(), kStreamMaxM * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  for (int64_t m : {1, 13, 32}) {
    std::vector<int8_t> xq(static_cast<size_t>(m * k));
    for (int8_t& v : xq) v = static_cast<int8_t>(rng.range(-128, 127));
    // The kernel reads xq chunk by chunk (stream_xq_layout).
    std::vector<int8_t> blocked(stream_xq_bytes(m, k), 0);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t e = 0; e < k; ++e)
        blocked[blocked_at(m, i, e)] = xq[static_cast<size_t>(i * k + e)];
    }
    ASSERT_EQ(cudaMemcpy(dxq.get(), blocked.data(), blocked.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    const std::vector<int32_t> want = host_gemm(xq, w, m, n, k);
    for (int grid :
         {1, 2, 5, 7, 48, static_cast<int>(units) - 1, static_cast<int>(units), max_grid}) {
      ASSERT_EQ(cudaMemset(dcnt.get(), 0, static_cast<size_t>(stream_s8_counters(n)) * 4),
                cudaSuccess);
      ASSERT_EQ(cudaMemset(dacc.get(), 0xff, static_cast<size_t>(m * n) * 4), cudaSuccess);
      StreamS8Args a = acc_launch(dw, dsb, dy, dacc, dpart, m, n, k, grid);
      a.xq = dxq.as<int8_t>();
      a.sa = dsa.as<float>();
      a.counters = dcnt.as<int32_t>();
      // Neither the ring slots filled before the grid dependency (all, one or none) nor the L2
      // prefetches after them change anything.
      a.prefetch = grid % 3 == 0 ? 0 : grid % 3 == 1 ? 1 : -1;
      a.l2_prefetch = grid % 2 == 0 ? 3 : 0;
      ASSERT_EQ(launch_stream_s8(a, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<int32_t> got(want.size());
      ASSERT_EQ(cudaMemcpy(got.data(), dacc.get(), got.size() * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(first_mismatch(want, got), -1)
          << "M=" << m << " grid=" << grid << " slots first=" << a.prefetch
          << " prefetch=" << a.l2_prefetch;
    }
  }
}

// The fused launch (quantizing inside the kernel) at every kind of grid, launched again and again
// on the same flags, which start as garbage and are never cleared between launches: bf16 rows of
// integers in [-127, 127] that each hold 127 quantize to themselves (dynamic symmetric), so acc
// is a host int32 GEMM of x; block 0's sa and xq are checked too.
TEST_F(StreamS8Test, FusedLaunchesReuseTheirFlagsAtEveryGrid) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const int64_t n = 1040, k = 3088;  // 17 row blocks (the last 16 rows), 7 chunks (the last 16 B)
  const int64_t units = 17 * 7;
  std::vector<int8_t> w(static_cast<size_t>(n * k));
  for (int8_t& v : w) v = static_cast<int8_t>(rng.range(-128, 127));
  std::vector<float> ones(static_cast<size_t>(n), 1.f);
  const int max_grid = static_cast<int>(units) + 5;
  const int64_t max_m = std::min(kStreamFuseMaxM, kStreamFuseMaxElems / k);
  DeviceBuffer dw, dx, dxq, dsb, dsa, dy, dacc, dflags, dpart;
  ASSERT_TRUE(dw.allocate(w.size(), "w").ok());
  ASSERT_TRUE(dx.allocate(static_cast<size_t>(max_m * k) * 2, "x").ok());
  ASSERT_TRUE(dxq.allocate(stream_xq_bytes(kStreamFuseMaxM, k), "xq").ok());
  ASSERT_TRUE(dsb.allocate(static_cast<size_t>(n) * 4, "sb").ok());
  ASSERT_TRUE(dsa.allocate(kStreamFuseMaxM * 4, "sa").ok());
  ASSERT_TRUE(dy.allocate(static_cast<size_t>(kStreamFuseMaxM * n) * 4, "y").ok());
  ASSERT_TRUE(dacc.allocate(static_cast<size_t>(kStreamFuseMaxM * n) * 4, "acc").ok());
  ASSERT_TRUE(dflags.allocate(stream_s8_flags_bytes(max_grid), "flags").ok());
  ASSERT_TRUE(dpart.allocate(stream_s8_partials_bytes(max_grid, kStreamFuseMaxM), "partials").ok());
  ASSERT_EQ(cudaMemcpy(dw.get(), w.data(), w.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dsb.get(), ones.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(dflags.get(), 0xab, stream_s8_flags_bytes(max_grid)), cudaSuccess);
  const uint64_t token = rng.next() | 1;
  for (int64_t m : {int64_t{1}, int64_t{3}, max_m}) {
    std::vector<int8_t> xq(static_cast<size_t>(m * k));
    for (int8_t& v : xq) v = static_cast<int8_t>(rng.range(-127, 127));
    for (int64_t i = 0; i < m; ++i) xq[static_cast<size_t>(i * k + rng.range(0, k - 1))] = 127;
    std::vector<uint16_t> x(xq.size());  // bf16 bits of each integer, exact
    for (size_t i = 0; i < x.size(); ++i) {
      const float f = static_cast<float>(xq[i]);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      x[i] = static_cast<uint16_t>(bits >> 16);
    }
    ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    const std::vector<int32_t> want = host_gemm(xq, w, m, n, k);
    for (int grid :
         {1, 2, 5, 7, 48, static_cast<int>(units) - 1, static_cast<int>(units), max_grid}) {
      for (const auto& [stages, ahead] :
           {std::pair{0, 0}, std::pair{2, 0}, std::pair{2, 4}, std::pair{3, 2}}) {
        ASSERT_EQ(cudaMemset(dacc.get(), 0xff, static_cast<size_t>(m * n) * 4), cudaSuccess);
        ASSERT_EQ(cudaMemset(dsa.get(), 0, kStreamFuseMaxM * 4), cudaSuccess);
        ASSERT_EQ(cudaMemset(dxq.get(), 0x55, stream_xq_bytes(m, k)), cudaSuccess);
        StreamS8Args a = acc_launch(dw, dsb, dy, dacc, dpart, m, n, k, grid);
        a.stages = stages;
        a.l2_prefetch = ahead;
        a.fuse = true;
        a.x = dx.get();
        a.x_type = ElemType::kBF16;
        a.sa_out = dsa.as<float>();
        a.xq_out = dxq.as<int8_t>();
        a.flags = dflags.as<uint64_t>();
        a.token = token;
        ASSERT_EQ(launch_stream_s8(a, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<int32_t> got(want.size());
        ASSERT_EQ(cudaMemcpy(got.data(), dacc.get(), got.size() * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        EXPECT_EQ(first_mismatch(want, got), -1)
            << "M=" << m << " grid=" << grid << " stages=" << stages << " prefetch=" << ahead;
        std::vector<float> sa(static_cast<size_t>(m));
        ASSERT_EQ(cudaMemcpy(sa.data(), dsa.get(), sa.size() * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        for (float v : sa) EXPECT_EQ(v, 1.f) << "M=" << m << " grid=" << grid;  // 127 / 127
        std::vector<int8_t> blocked(stream_xq_bytes(m, k));
        ASSERT_EQ(cudaMemcpy(blocked.data(), dxq.get(), blocked.size(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        int64_t bad = -1;
        for (int64_t i = 0; i < m * k && bad < 0; ++i) {
          const int64_t r = i / k, e = i % k;
          if (blocked[blocked_at(m, r, e)] != xq[static_cast<size_t>(i)]) bad = i;
        }
        EXPECT_EQ(bad, -1) << "xq, M=" << m << " grid=" << grid;
      }
    }
  }
  // What the fused launch refuses: fp32 rows, rows too long, no token.
  StreamS8Args a;
  a.m = 1;
  a.n = n;
  a.k = k;
  a.grid = 4;
  a.fuse = true;
  a.x = dx.get();
  a.sa_out = dsa.as<float>();
  a.flags = dflags.as<uint64_t>();
  a.token = token;
  a.x_type = ElemType::kF32;
  EXPECT_EQ(launch_stream_s8(a, nullptr), cudaErrorInvalidValue);
  a.x_type = ElemType::kBF16;
  a.m = kStreamFuseMaxM + 1;
  EXPECT_EQ(launch_stream_s8(a, nullptr), cudaErrorInvalidValue);
  a.m = 1;
  a.token = 0;
  EXPECT_EQ(launch_stream_s8(a, nullptr), cudaErrorInvalidValue);
}

// Through the layer: M = 1 (fused) and M = 16 (the quantize kernel) alternating on one layer,
// sharing the call contexts' scratch, every answer exact.
TEST_F(StreamS8Test, FusedAndUnfusedCallsAlternateOnOneLayer) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  for (Scheme scheme : kSchemes) {
    const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 4112, 5136, true));
    if (p.kernel == nullptr) return;
    // The fused form's ring was timed at load; the explanation says which form runs.
    const std::string at1 = p.owner->variant(1), at16 = p.owner->variant(16);
    EXPECT_TRUE(absl::StartsWith(at1, "quantizes inside the launch (16-bit activations); ring of "))
        << at1;
    // "N slots (timed ...)" or "N slots and P units prefetched into L2 (timed ...)".
    EXPECT_TRUE(absl::StrContains(at1, " slots")) << at1;
    EXPECT_TRUE(absl::EndsWith(at1, " (timed fastest at load, M=1)")) << at1;
    // (A layer within the L2: the two-launch form's prefetch is not timed.)
    EXPECT_EQ(at16, "the quantize kernel first, this kernel as its programmatic dependent");
    for (int round = 0; round < 3; ++round) {
      for (int64_t m : {1, 16, 2, 6, 7}) {
        const DType xt = round == 1 ? DType::kF16 : DType::kBF16;
        EXPECT_TRUE(check_call(p, make_x(rng, m, 5136, xt), xt, m, DType::kBF16))
            << "round " << round << " M=" << m;
      }
    }
  }
}

// A layer larger than the L2: the two-launch form's start (ring slots filled before the grid
// dependency, units prefetched into L2) is timed at load too, the explanation names it, and a
// call of that form with it is exact.
TEST_F(StreamS8Test, TimesTheTwoLaunchPrefetchOnLayersPastTheL2) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const absl::StatusOr<int64_t> l2 = device_l2_bytes();
  ASSERT_TRUE(l2.ok()) << l2.status();
  const int64_t k = 8192, n = (*l2 / k / 16 + 1) * 16 + 16 * rng.range(0, 4);
  const Prepared p = prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, n, k, true));
  if (p.kernel == nullptr) return;
  const std::string at16 = p.owner->variant(16);
  // "...; before it waits, S filled and P units prefetched into L2 (...)".
  EXPECT_TRUE(absl::StartsWith(
      at16,
      "the quantize kernel first, this kernel as its programmatic dependent; before it "
      "waits, "))
      << at16;
  EXPECT_TRUE(absl::EndsWith(at16, " units prefetched into L2 (timed fastest at load, M=16)"))
      << at16;
  EXPECT_TRUE(check_call(p, make_x(rng, 16, k, DType::kBF16), DType::kBF16, 16, DType::kBF16))
      << "N=" << n;
}

// Layers of one shape sharing a TuningCache: the second takes the first one's ring and start (its
// explanation says so) and answers exactly; a layer of another K times its own.
TEST_F(StreamS8Test, LaterLayersOfAShapeTakeTheFirstOnesRing) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const absl::StatusOr<int64_t> l2 = device_l2_bytes();
  ASSERT_TRUE(l2.ok()) << l2.status();
  // Past the L2, so that both the fused ring and the two-launch start are timed.
  const int64_t k = 4096, n = (*l2 / k / 16 + 1) * 16;
  TuningCache tuning;
  const Prepared first =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, n, k, true), &tuning);
  if (first.kernel == nullptr) return;
  const Prepared second =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, n, k, true), &tuning);
  ASSERT_NE(second.kernel, nullptr);
  EXPECT_EQ(tuning.size(), 1u);
  const std::string note(kTunedByEarlierLayer);
  for (int64_t m : {int64_t{1}, int64_t{16}}) {
    const std::string v1 = first.owner->variant(m), v2 = second.owner->variant(m);
    EXPECT_TRUE(absl::EndsWith(v1, absl::StrCat("(timed fastest at load, M=", m, ")"))) << v1;
    EXPECT_TRUE(absl::EndsWith(v2, absl::StrCat("(timed fastest at load, M=", m, note, ")"))) << v2;
    EXPECT_EQ(absl::StrReplaceAll(v2, {{note, ""}}), v1);
    EXPECT_TRUE(check_call(second, make_x(rng, m, k, DType::kBF16), DType::kBF16, m, DType::kBF16));
  }
  const Prepared other =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, n, k + 16, true), &tuning);
  ASSERT_NE(other.kernel, nullptr);
  EXPECT_EQ(tuning.size(), 2u);
  EXPECT_TRUE(absl::EndsWith(other.owner->variant(1), "(timed fastest at load, M=1)"))
      << other.owner->variant(1);

  // Prepared on demand (as a request prepares a kernel the load did not): a stored shape's ring
  // is taken; a new shape's is timed, said to be timed on first use, and not stored.
  const Prepared taken = prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, n, k, true),
                                 &tuning, /*on_demand=*/true);
  ASSERT_NE(taken.kernel, nullptr);
  const Prepared timed =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, n, k + 32, true), &tuning,
              /*on_demand=*/true);
  ASSERT_NE(timed.kernel, nullptr);
  EXPECT_EQ(tuning.size(), 2u);
  for (int64_t m : {int64_t{1}, int64_t{16}}) {
    EXPECT_EQ(taken.owner->variant(m), second.owner->variant(m)) << "M=" << m;
    const std::string v = timed.owner->variant(m);
    EXPECT_TRUE(absl::EndsWith(v, absl::StrCat("(timed fastest on first use, M=", m, ")"))) << v;
    EXPECT_TRUE(
        check_call(timed, make_x(rng, m, k + 32, DType::kBF16), DType::kBF16, m, DType::kBF16));
  }
}

// The autotune's measurement, after an L2 read and back to back (as the fused ring's timing on
// layers over twice the L2 uses it): both time the call, and a shape it cannot run is refused.
TEST_F(StreamS8Test, MeasuresColdAndBackToBack) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const Prepared p =
      prepare(*kernel_, make_layer(rng, Scheme::kDynamicSymmetric, 1040, 3088, true));
  if (p.kernel == nullptr) return;
  for (bool cold : {true, false}) {
    const absl::StatusOr<double> us =
        p.kernel->measure_us(ProblemShape{1, 1040, 3088, DType::kBF16, DType::kBF16}, cold);
    ASSERT_TRUE(us.ok()) << us.status();
    EXPECT_GT(*us, 0.0) << "cold=" << cold;
    EXPECT_LT(*us, 1e6) << "cold=" << cold;
  }
  const absl::StatusOr<double> bad =
      p.kernel->measure_us(ProblemShape{0, 1040, 3088, DType::kBF16, DType::kBF16}, false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "cannot measure M=0, N=1040, K=3088");
}

// The fused form's non-finite rows (the shared test in gemv_s8_test.cc runs 12 rows, which it
// never takes): NaN or +-Inf in any row, first or last value included, at M = 1..3 on 16-bit
// rows of 64 and 8208 values, is INVALID_ARGUMENT with the reference's exact message (block 0's
// sa flags the row), and y is left untouched.
TEST_F(StreamS8Test, FusedRejectsNonFiniteRowsLikeTheReference) {
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t k : {int64_t{64}, int64_t{8208}}) {
    struct Bad {
      int64_t m, row, col;
      float v;
    };
    const Bad cases[] = {{1, 0, 0, nan}, {1, 0, k - 1, inf}, {2, 1, k / 2, -inf}, {3, 2, 7, nan}};
    for (Scheme scheme : kSchemes) {
      const Prepared p = prepare(*kernel_, make_layer(rng, scheme, 80, k, true));
      if (p.kernel == nullptr) return;
      for (DType xt : {DType::kBF16, DType::kF16}) {
        for (const Bad& b : cases) {
          ASSERT_TRUE(stream_s8_fuses_rows(b.m, k));
          std::vector<uint8_t> x = make_x(rng, b.m, k, xt);
          store_from_f32(x.data(), xt, b.row * k + b.col, b.v);
          const Expected want = reference_run(*p.weights, x.data(), xt, b.m, DType::kBF16);
          ASSERT_EQ(want.status.code(), absl::StatusCode::kInvalidArgument);
          std::vector<uint16_t> y(static_cast<size_t>(b.m * 80), 0xBEEF);
          RunArgs args;
          args.x = x.data();
          args.x_dtype = xt;
          args.m = b.m;
          args.y = y.data();
          args.y_dtype = DType::kBF16;
          const absl::Status st = p.kernel->run(args, nullptr);
          EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st << " K=" << k;
          EXPECT_EQ(st.message(), want.status.message()) << "K=" << k;
          EXPECT_EQ(y, std::vector<uint16_t>(y.size(), 0xBEEF)) << "y was written on error";
        }
      }
    }
  }
}

TEST(StreamS8Kernel, DeclinesWhatItCannotRun) {
  auto k = make_stream_s8_kernel();
  EXPECT_EQ(k->name(), "cuda.stream_s8");
  LayerConfig c;
  c.n = 64;
  c.k = 100;
  absl::Status s = k->can_implement(c, ProblemShape{1, 64, 100, DType::kBF16, DType::kBF16});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "K=100 is not a multiple of 16 (16-byte bulk copies)");
  c.k = 128;
  c.n = 52;
  s = k->can_implement(c, ProblemShape{1, 52, 128, DType::kBF16, DType::kBF16});
  EXPECT_EQ(s.message(), "N=52 is not a multiple of 16 (16-row mma tiles)");
  c.n = 64;
  EXPECT_TRUE(k->can_implement(c, ProblemShape{32, 64, 128, DType::kF32, DType::kF16}).ok());
  s = k->can_implement(c, ProblemShape{33, 64, 128, DType::kBF16, DType::kBF16});
  EXPECT_EQ(s.message(), "M=33 is outside 1..32 (small-M kernel)");
  EXPECT_EQ(k->preferred_m().min, 1);
  EXPECT_EQ(k->preferred_m().max, 16);
}

}  // namespace
}  // namespace qlinear::gpu::testing
