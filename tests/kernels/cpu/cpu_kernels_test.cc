// cpu.amx, cpu.avx512_vnni, cpu.onednn and cpu.avx2 against cpu.reference through the Kernel
// interface: the whole W8A8 op (quantize, GEMM, epilogue) bit for bit on y, sa and azp;
// accumulators bit for bit through an identity epilogue; every scheme x input dtype x output dtype
// x bias, per-channel, per-tensor and per-partition scales, M = 1..67 and N, K with odd tails;
// non-finite rows rejected with the reference's message; several threads on one prepared kernel.
// Each test runs once per kernel (CpuKernelTest), and skips with the reason where this host cannot
// run that kernel.
//
// Combinations are sampled, not crossed, to keep the suite fast: every M in 1..67 on small
// layers, a spread of M (tile edges 1, 6, 7, 12, 13, 16, 17 and 67 included) on large ones, and
// the dtype pairs cycled so that each layer shape sees several.
#include "kernels/cpu/cpu_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/amx_kernel.h"
#include "kernels/cpu/avx2_kernel.h"
#include "kernels/cpu/avx512_vnni_kernel.h"
#include "kernels/cpu/cpu_support.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/reference/reference_w8a8.h"
#include "kernels/registry.h"
#include "tests/kernels/cpu/cpu_test_util.h"

namespace qlinear::cpu {
namespace {

using testing::kAllDTypes;
using testing::kAllSchemes;
using testing::LayerOptions;
using testing::ScaleMode;

// The kernels under test, one instance of each CpuKernelTest apiece.
struct KernelUnderTest {
  const char* name;  // the instance's name
  std::unique_ptr<Kernel> (*make)();
};
const KernelUnderTest kKernels[] = {{"amx", make_amx_kernel},
                                    {"avx512_vnni", make_avx512_vnni_kernel},
                                    {"onednn", make_onednn_kernel},
                                    {"avx2", make_avx2_kernel}};
void PrintTo(const KernelUnderTest& k, std::ostream* os) { *os << k.name; }

// A test of one CPU kernel, skipped with the reason where this host cannot run it.
class CpuKernelTest : public ::testing::TestWithParam<KernelUnderTest> {
 protected:
  void SetUp() override {
    kernel_ = GetParam().make();
    const absl::Status s = kernel_->is_supported(host_info());
    if (!s.ok()) GTEST_SKIP() << kernel_->name() << " cannot run here: " << s.message();
  }
  std::unique_ptr<Kernel> kernel_;
};

struct Output {
  absl::Status status;
  std::vector<uint8_t> y;
  std::vector<float> sa;
  std::vector<int32_t> azp;
};

Output run_one(const PreparedKernel& k, const std::vector<uint8_t>& x, DType x_dtype, int64_t m,
               int64_t n, DType y_dtype) {
  Output o;
  o.y.assign(static_cast<size_t>(m * n) * dtype_size(y_dtype), 0xcd);
  o.sa.assign(m, -1.f);
  o.azp.assign(m, -1);
  RunArgs a;
  a.x = x.data();
  a.x_dtype = x_dtype;
  a.m = m;
  a.y = o.y.data();
  a.y_dtype = y_dtype;
  a.sa = o.sa.data();
  a.azp = o.azp.data();
  RunTimings t;
  o.status = k.run(a, &t);
  return o;
}

Output run_reference(const LayerWeights& w, const std::vector<uint8_t>& x, DType x_dtype, int64_t m,
                     DType y_dtype) {
  static const std::unique_ptr<Kernel> ref = reference::make_reference_kernel();
  auto prepared = ref->prepare(w);
  return run_one(**prepared, x, x_dtype, m, w.config.n, y_dtype);
}

void expect_same(const Output& got, const Output& want, const LayerConfig& c, int64_t m,
                 DType y_dtype, const std::string& what) {
  ASSERT_TRUE(want.status.ok()) << want.status;
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
  const int64_t d =
      testing::first_difference(got.y.data(), want.y.data(), m * c.n, dtype_size(y_dtype));
  ASSERT_EQ(d, -1) << what << ": y differs at row " << d / c.n << " column " << d % c.n << ": "
                   << load_as_f32(got.y.data(), y_dtype, d) << " vs "
                   << load_as_f32(want.y.data(), y_dtype, d);
  ASSERT_EQ(testing::first_difference(got.sa.data(), want.sa.data(), m, 4), -1) << what << ": sa";
  if (is_asymmetric(c.scheme)) {
    ASSERT_EQ(testing::first_difference(got.azp.data(), want.azp.data(), m, 4), -1)
        << what << ": azp";
  }
}

// Runs every kernel on one layer for each M in `ms`, cycling the dtype pairs, and counts in
// *compared the calls each kernel was compared on. Every kernel must take every shape: the CPU
// kernels decline only a K beyond their limit, far above these layers' K.
void check_layer(SplitMix64& rng, const std::vector<const Kernel*>& kernels, const LayerWeights& w,
                 const std::vector<int64_t>& ms, int64_t* compared) {
  std::vector<std::unique_ptr<PreparedKernel>> prepared;
  for (const auto& k : kernels) {
    auto p = k->prepare(w);
    ASSERT_TRUE(p.ok()) << k->name() << ": " << p.status();
    prepared.push_back(std::move(*p));
  }
  int64_t pair = rng.range(0, 8);
  for (int64_t m : ms) {
    const DType x_dtype = kAllDTypes[pair % 3], y_dtype = kAllDTypes[(pair / 3) % 3];
    ++pair;
    const std::vector<uint8_t> x = testing::random_x(rng, m, w.config.k, x_dtype);
    const Output want = run_reference(w, x, x_dtype, m, y_dtype);
    for (size_t i = 0; i < kernels.size(); ++i) {
      const ProblemShape shape{m, w.config.n, w.config.k, x_dtype, y_dtype};
      const std::string what =
          std::string(kernels[i]->name()) + " " + testing::describe(w.config, m, x_dtype, y_dtype);
      const absl::Status can = kernels[i]->can_implement(w.config, shape);
      ASSERT_TRUE(can.ok()) << what << " declined: " << can;
      expect_same(run_one(*prepared[i], x, x_dtype, m, w.config.n, y_dtype), want, w.config, m,
                  y_dtype, what);
      if (::testing::Test::HasFatalFailure()) return;
    }
    ++*compared;
  }
}

ScaleMode scale_mode(int64_t i) { return static_cast<ScaleMode>(i % 3); }

TEST_P(CpuKernelTest, SmallLayersEveryMFrom1To67) {
  QL_SEEDED_RNG(rng);
  std::vector<int64_t> ms(67);
  for (int64_t i = 0; i < 67; ++i) ms[i] = i + 1;
  int64_t variant = rng.range(0, 5);
  int64_t compared = 0;
  for (int64_t n : {1, 15}) {
    for (int64_t k : {17, 496}) {
      for (Scheme scheme : kAllSchemes) {
        ++variant;
        const LayerOptions o{n, k, scheme, variant % 2 == 0, scale_mode(variant / 2)};
        auto w = testing::random_layer(rng, o);
        ASSERT_NE(w, nullptr);
        check_layer(rng, {kernel_.get()}, *w, ms, &compared);
        if (HasFatalFailure()) return;
      }
    }
  }
  EXPECT_EQ(compared, 2 * 2 * 4 * 67);
}

TEST_P(CpuKernelTest, LargeLayersSampledM) {
  QL_SEEDED_RNG(rng);
  int64_t variant = rng.range(0, 5);
  int64_t compared = 0;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1025},  {15, 4099},  {971, 17},
                                                {971, 496}, {971, 1025}, {971, 4099}};
  for (const auto& [n, k] : shapes) {
    for (Scheme scheme : kAllSchemes) {
      ++variant;
      const LayerOptions o{n, k, scheme, variant % 2 == 0, scale_mode(variant / 2)};
      auto w = testing::random_layer(rng, o);
      ASSERT_NE(w, nullptr);
      // Tile edges (the register tile has 6 rows), the small-M limit, and random fill-ins.
      std::vector<int64_t> ms = {1, 6, 7, rng.range(2, 5), rng.range(12, 17), rng.range(18, 66),
                                 67};
      if (n * k > 1000000) ms = {1, rng.range(6, 7), rng.range(12, 17), 67};
      check_layer(rng, {kernel_.get()}, *w, ms, &compared);
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GT(compared, 0);
}

// cpu.avx512_vnni's streaming forms (VnniTuning): whole rows per task on a layer with enough
// panels for every thread of this host's pool, K in shallow blocks with the next one streamed
// (up to block_max_m, rows split past stream_max_m), and the form without them; each against the
// reference on M around the tile edges and the forms' limits.
TEST(CpuKernels, VnniStreamingFormsMatchTheReference) {
  const absl::Status s = avx512_vnni_supported(host_info());
  if (!s.ok()) GTEST_SKIP() << "cpu.avx512_vnni cannot run here: " << s.message();
  QL_SEEDED_RNG(rng);
  VnniTuning shallow;
  shallow.k_block = 4 * rng.range(16, 64);
  shallow.whole_rows_min_panels = 1;
  VnniTuning split_rows;
  split_rows.stream_max_m = 16;
  split_rows.block_max_m = 16;
  split_rows.k_block = 0;
  split_rows.prefetch_next_block = false;
  split_rows.whole_rows_min_panels = 0;
  const std::unique_ptr<Kernel> kernels[] = {make_avx512_vnni_kernel(),
                                             make_avx512_vnni_kernel(shallow),
                                             make_avx512_vnni_kernel(split_rows)};
  const int64_t threads = ThreadPool::global().threads();
  const LayerOptions o{64 * 2 * threads + rng.range(1, 63), 1000 + rng.range(0, 100),
                       kAllSchemes[rng.range(0, 3)], rng.range(0, 1) == 1, ScaleMode::kPerChannel};
  auto w = testing::random_layer(rng, o);
  ASSERT_NE(w, nullptr);
  int64_t compared = 0;
  check_layer(rng, {kernels[0].get(), kernels[1].get(), kernels[2].get()}, *w,
              {1, 6, 7, rng.range(8, 17), 18, rng.range(19, 63), 64, 65, rng.range(66, 127), 128,
               129, rng.range(130, 255), 256, 257},
              &compared);
  EXPECT_EQ(compared, 14);
}

// More rows than one GEMM call takes (kVnniMaxRows and kAvx2MaxRows are 516), on enough panels
// (N >= 512) that the work split has to cut the rows for that reason alone, and with K long enough
// to be cut into blocks.
TEST_P(CpuKernelTest, MoreRowsThanOneChunkOnLongK) {
  QL_SEEDED_RNG(rng);
  const Scheme scheme = kAllSchemes[rng.range(0, 3)];
  const LayerOptions o{rng.range(512, 560), 4099 + 2 * rng.range(0, 50), scheme,
                       rng.range(0, 1) == 1, ScaleMode::kPerChannel};
  auto w = testing::random_layer(rng, o);
  ASSERT_NE(w, nullptr);
  int64_t compared = 0;
  check_layer(rng, {kernel_.get()}, *w, {rng.range(517, 700)}, &compared);
  EXPECT_EQ(compared, 1);
}

// A shape with a K tail on which oneDNN 2.6's AMX int8 matmul executed an illegal instruction
// (cpu.onednn now pads K to whole blocks of 64); every kernel must serve it.
TEST_P(CpuKernelTest, AKTailThatOneDnnsAmxMatmulFailedOn) {
  QL_SEEDED_RNG(rng);
  const LayerOptions o{527, 4159, kAllSchemes[rng.range(0, 3)], true, ScaleMode::kPerChannel};
  auto w = testing::random_layer(rng, o);
  ASSERT_NE(w, nullptr);
  int64_t compared = 0;
  check_layer(rng, {kernel_.get()}, *w, {615}, &compared);
  EXPECT_EQ(compared, 1);
}

// Static symmetric with input_scale 1, sb 1 and no bias makes y = f32(acc) in fp32: exact for
// |acc| < 2^24, and for the extremes below, whose values are multiples of large powers of two.
TEST_P(CpuKernelTest, AccumulatorsAreExactThroughAnIdentityEpilogue) {
  QL_SEEDED_RNG(rng);
  auto identity_layer = [](int64_t n, int64_t k, std::vector<int8_t> w) {
    LayerSpec spec;
    spec.n = n;
    spec.k = k;
    spec.scheme = Scheme::kStaticSymmetric;
    spec.weight_scale = {1.f};
    spec.has_input_scale = true;
    spec.input_scale = 1.f;
    return build_layer_weights(spec, std::move(w));
  };
  struct Case {
    int64_t n, k;
    bool extreme;
  };
  const Case cases[] = {{1, 17, false},    {15, 496, false},  {971, 1025, false},
                        {33, 4099, false}, {17, 65793, true}, {17, kMaxK, true}};
  int compared = 0;
  for (const Case& cs : cases) {
    std::vector<int8_t> w =
        cs.extreme ? std::vector<int8_t>(cs.n * cs.k, -128) : random_int8(rng, cs.n * cs.k);
    auto layer = identity_layer(cs.n, cs.k, w);
    ASSERT_TRUE(layer.ok()) << layer.status();
    const int64_t m = cs.extreme ? 2 : rng.range(1, 20);
    std::vector<int8_t> xq(m * cs.k);
    std::vector<float> x(m * cs.k);
    for (int64_t i = 0; i < m * cs.k; ++i) {
      // Extreme rows: 127 (255 after the shift: the unsigned sums wrap int32) and -128.
      xq[i] = cs.extreme ? (i < cs.k ? int8_t{127} : int8_t{-128})
                         : static_cast<int8_t>(rng.range(-128, 127));
      x[i] = xq[i];
    }
    std::vector<int32_t> acc(m * cs.n);
    reference::gemm_s8s8_s32(xq.data(), w.data(), m, cs.n, cs.k, acc.data());
    std::vector<uint8_t> xb(x.size() * 4);
    std::memcpy(xb.data(), x.data(), xb.size());
    const ProblemShape shape{m, cs.n, cs.k, DType::kF32, DType::kF32};
    if (const absl::Status s = kernel_->can_implement((*layer)->config, shape); !s.ok()) {
      EXPECT_EQ(kernel_->name(), "cpu.onednn") << s;  // only oneDNN declines, above its K limit
      EXPECT_GT(cs.k, kOneDnnMaxK) << s;
      continue;
    }
    auto p = kernel_->prepare(**layer);
    ASSERT_TRUE(p.ok()) << p.status();
    const Output o = run_one(**p, xb, DType::kF32, m, cs.n, DType::kF32);
    ASSERT_TRUE(o.status.ok()) << o.status;
    for (int64_t i = 0; i < m * cs.n; ++i) {
      float y;
      std::memcpy(&y, o.y.data() + 4 * i, 4);
      ASSERT_EQ(y, static_cast<float>(acc[i])) << "N=" << cs.n << " K=" << cs.k << " element " << i;
    }
    ++compared;
  }
  // Every case but the one above oneDNN's K limit.
  EXPECT_EQ(compared, kernel_->name() == "cpu.onednn" ? 5 : 6);
}

TEST_P(CpuKernelTest, NonFiniteRowsAreRejectedAsTheReferenceDoes) {
  QL_SEEDED_RNG(rng);
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (Scheme scheme : kAllSchemes) {
    for (DType x_dtype : kAllDTypes) {
      auto w = testing::random_layer(
          rng, {19, rng.range(1, 300), scheme, false, ScaleMode::kPerChannel});
      ASSERT_NE(w, nullptr);
      // Enough rows that quantization is split over threads: the lowest bad row must win.
      const int64_t m = rng.range(1, 3) == 1 ? rng.range(2, 9) : rng.range(200, 400);
      std::vector<uint8_t> x = testing::random_x(rng, m, w->config.k, x_dtype);
      const int64_t first = rng.range(0, m - 1);
      for (int64_t row : {first, std::min(m - 1, first + rng.range(0, 100))}) {
        const int64_t col = rng.range(0, w->config.k - 1);
        store_from_f32(x.data(), x_dtype, row * w->config.k + col, bad[rng.range(0, 2)]);
      }
      const Output want = run_reference(*w, x, x_dtype, m, DType::kBF16);
      ASSERT_EQ(want.status.code(), absl::StatusCode::kInvalidArgument);
      auto p = kernel_->prepare(*w);
      ASSERT_TRUE(p.ok()) << p.status();
      const Output got = run_one(**p, x, x_dtype, m, w->config.n, DType::kBF16);
      EXPECT_EQ(got.status.code(), absl::StatusCode::kInvalidArgument) << got.status;
      EXPECT_EQ(got.status.message(), want.status.message());
    }
  }
}

// A call that fails (a non-finite row in its last row) gives back its scratch as a good call
// does: the thread that served a large call keeps at most kKeepScratchBytes of it.
TEST_P(CpuKernelTest, ALargeCallLeavesNoScratchBehindFailedOrNot) {
  QL_SEEDED_RNG(rng);
  // x of 2048 x 33000: 67.6 MB as int8, the kernels' scratch above kKeepScratchBytes (64 MiB).
  const int64_t m = 2048, k = 33000;
  auto w = testing::random_layer(
      rng, {16, k, Scheme::kDynamicAsymmetric, false, ScaleMode::kPerChannel});
  ASSERT_NE(w, nullptr);
  auto p = kernel_->prepare(*w);
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<uint8_t> x = testing::random_x(rng, m, k, DType::kBF16);
  const Output good = run_one(**p, x, DType::kBF16, m, w->config.n, DType::kBF16);
  ASSERT_TRUE(good.status.ok()) << good.status;
  EXPECT_LE(thread_scratch_bytes_for_testing(), kKeepScratchBytes) << "after a good call";
  store_from_f32(x.data(), DType::kBF16, (m - 1) * k + rng.range(0, k - 1),
                 std::numeric_limits<float>::quiet_NaN());
  const Output bad = run_one(**p, x, DType::kBF16, m, w->config.n, DType::kBF16);
  ASSERT_EQ(bad.status.code(), absl::StatusCode::kInvalidArgument) << bad.status;
  EXPECT_LE(thread_scratch_bytes_for_testing(), kKeepScratchBytes) << "after a failed call";
}

TEST_P(CpuKernelTest, ManyThreadsOnOnePreparedKernel) {
  QL_SEEDED_RNG(rng);
  auto w = testing::random_layer(
      rng, {203, 515, Scheme::kDynamicAsymmetric, true, ScaleMode::kPerPartition});
  ASSERT_NE(w, nullptr);
  struct Request {
    int64_t m;
    DType x_dtype, y_dtype;
    std::vector<uint8_t> x;
    Output want;
  };
  std::vector<Request> requests;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.m = i % 3 == 0 ? rng.range(1, 4) : rng.range(5, 150);
    r.x_dtype = kAllDTypes[rng.range(0, 2)];
    r.y_dtype = kAllDTypes[rng.range(0, 2)];
    r.x = testing::random_x(rng, r.m, w->config.k, r.x_dtype);
    r.want = run_reference(*w, r.x, r.x_dtype, r.m, r.y_dtype);
    requests.push_back(std::move(r));
  }
  auto p = kernel_->prepare(*w);
  ASSERT_TRUE(p.ok()) << p.status();
  const PreparedKernel& prepared = **p;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int iter = 0; iter < 6; ++iter) {
        const Request& r = requests[(t * 5 + iter * 7) % requests.size()];
        const Output o = run_one(prepared, r.x, r.x_dtype, r.m, w->config.n, r.y_dtype);
        if (!o.status.ok() || o.y != r.want.y || o.sa != r.want.sa || o.azp != r.want.azp) {
          mismatches.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(CpuKernels, DeclineWithReasonsOnHostsWithoutVnni) {
  HostInfo host = host_info();
  host.avx512_vnni = false;
  host.avx512bw = false;
  for (const auto& k : {make_avx512_vnni_kernel(), make_onednn_kernel()}) {
    const absl::Status s = k->is_supported(host);
    ASSERT_FALSE(s.ok()) << k->name();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    // Either the ISA is named or the kernel says it is not compiled in.
    const std::string msg(s.message());
    EXPECT_TRUE(msg.find("avx512_vnni") != std::string::npos ||
                msg.find("not compiled in") != std::string::npos)
        << k->name() << ": " << msg;
  }
}

TEST(CpuKernels, Avx2DeclinesWithReasonsOnHostsWithoutIt) {
  for (const char* missing : {"avx2", "fma", "f16c"}) {
    HostInfo host = host_info();
    host.avx2 = host.fma = host.f16c = true;
    if (std::string(missing) == "avx2") host.avx2 = false;
    if (std::string(missing) == "fma") host.fma = false;
    if (std::string(missing) == "f16c") host.f16c = false;
    const absl::Status s = make_avx2_kernel()->is_supported(host);
    ASSERT_FALSE(s.ok()) << missing;
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    const std::string msg(s.message());
    EXPECT_TRUE(msg == std::string("needs AVX2, FMA and F16C; this CPU lacks ") + missing ||
                msg.find("not compiled in") != std::string::npos)
        << missing << ": " << msg;
  }
  HostInfo host = host_info();
  host.avx2 = host.fma = host.f16c = true;
  const absl::Status s = make_avx2_kernel()->is_supported(host);
  EXPECT_TRUE(s.ok() || std::string(s.message()).find("not compiled in") != std::string::npos) << s;
}

TEST(CpuKernels, CanImplementLimits) {
  LayerConfig c;
  c.n = 8;
  c.k = kOneDnnMaxK + 1;
  const ProblemShape shape{1, c.n, c.k, DType::kBF16, DType::kBF16};
  EXPECT_TRUE(make_avx512_vnni_kernel()->can_implement(c, shape).ok());
  const absl::Status s = make_onednn_kernel()->can_implement(c, shape);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("65793"), std::string::npos) << s;
  EXPECT_TRUE(make_avx2_kernel()->can_implement(c, shape).ok());
  c.k = kMaxK + 1;
  EXPECT_FALSE(make_avx512_vnni_kernel()->can_implement(c, shape).ok());
  EXPECT_FALSE(make_avx2_kernel()->can_implement(c, shape).ok());
}

// Autotune measures every CPU kernel but the reference (which the priority order ranks last):
// one call's median time on synthetic inputs, at most at M = kMeasureMaxM; a shape that is not
// the layer's is an error, never a crash. The measured calls leave the prepared kernel exact.
TEST_P(CpuKernelTest, MeasureTimesCallsOfThePreparedKernel) {
  EXPECT_FALSE(reference::make_reference_kernel()->measurable());
  QL_SEEDED_RNG(rng);
  const LayerOptions o{rng.range(40, 90), rng.range(100, 300), kAllSchemes[rng.range(0, 3)], true,
                       ScaleMode::kPerChannel};
  auto w = testing::random_layer(rng, o);
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(kernel_->measurable());
  auto p = kernel_->prepare(*w);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->max_measured_m(), kMeasureMaxM);
  // What autotune flushes before each timed call: the prepared weights, every byte of them.
  const auto* measured = dynamic_cast<const MeasuredCpuKernel*>(p->get());
  ASSERT_NE(measured, nullptr);
  EXPECT_NE(measured->weight_memory().data(), nullptr);
  EXPECT_GE(measured->weight_memory().size(), static_cast<size_t>(w->config.n * w->config.k));
  for (int64_t m : {int64_t{1}, int64_t{16}, kMeasureMaxM}) {
    for (DType x : kAllDTypes) {
      const absl::StatusOr<double> us =
          (*p)->measure_us(ProblemShape{m, w->config.n, w->config.k, x, DType::kBF16});
      ASSERT_TRUE(us.ok()) << us.status();
      EXPECT_GT(*us, 0.0) << "M=" << m;
      EXPECT_LT(*us, 1e6) << "M=" << m;  // a small layer: far under a second a call
    }
  }
  const absl::StatusOr<double> wrong =
      (*p)->measure_us(ProblemShape{1, w->config.n + 1, w->config.k, DType::kBF16, DType::kBF16});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("on a layer of N="), absl::string_view::npos)
      << wrong.status();
  const std::vector<uint8_t> x = testing::random_x(rng, 7, w->config.k, DType::kBF16);
  expect_same(run_one(**p, x, DType::kBF16, 7, w->config.n, DType::kF32),
              run_reference(*w, x, DType::kBF16, 7, DType::kF32), w->config, 7, DType::kF32,
              "after the measurements");
}

// The measurements share the buffer of their cache-emptying pass, which is freed about 2 s after
// the last one ends (a server that has loaded its layers does not keep it), and a later
// measurement takes a new one.
TEST(CpuKernels, MeasurementBufferIsFreedAfterTheLastMeasurement) {
  if (last_level_cache_bytes() <= 0) GTEST_SKIP() << "the host reports no last-level cache";
  // The first kernel this host runs: they all share the buffer.
  std::unique_ptr<Kernel> kernel;
  std::string cannot;
  for (const KernelUnderTest& k : kKernels) {
    kernel = k.make();
    const absl::Status s = kernel->is_supported(host_info());
    if (s.ok()) break;
    cannot += std::string(kernel->name()) + ": " + std::string(s.message()) + "; ";
    kernel = nullptr;
  }
  if (kernel == nullptr) GTEST_SKIP() << "no optimized CPU kernel runs here: " << cannot;
  QL_SEEDED_RNG(rng);
  auto w = testing::random_layer(
      rng, LayerOptions{16, 64, Scheme::kDynamicSymmetric, false, ScaleMode::kPerChannel});
  ASSERT_NE(w, nullptr);
  auto p = kernel->prepare(*w);
  ASSERT_TRUE(p.ok()) << p.status();
  const ProblemShape shape{1, w->config.n, w->config.k, DType::kBF16, DType::kBF16};
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE((*p)->measure_us(shape).ok());
    ASSERT_TRUE((*p)->measure_us(shape).ok());
    EXPECT_TRUE(measurement_buffer_held_for_testing()) << "round " << round;
    const auto t0 = std::chrono::steady_clock::now();
    while (measurement_buffer_held_for_testing() &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_FALSE(measurement_buffer_held_for_testing())
        << "round " << round << ": still held after 20 s";
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000))
        << "round " << round << ": freed before the 2 s it is kept";
  }
}

TEST(CpuKernels, RegisteredInPriorityOrderOnce) {
  Registry r;
  ASSERT_EQ(register_cpu_kernels(&r), absl::OkStatus());
  ASSERT_EQ(register_cpu_kernels(&r), absl::OkStatus());  // idempotent
  ASSERT_TRUE(r.add(reference::make_reference_kernel()).ok());
  std::vector<std::string> names;
  for (const Kernel* k : r.kernels()) names.emplace_back(k->name());
  EXPECT_EQ(names, (std::vector<std::string>{"cpu.amx", "cpu.avx512_vnni", "cpu.onednn", "cpu.avx2",
                                             "cpu.reference"}));
}

INSTANTIATE_TEST_SUITE_P(Kernel, CpuKernelTest, ::testing::ValuesIn(kKernels),
                         [](const ::testing::TestParamInfo<KernelUnderTest>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace qlinear::cpu
