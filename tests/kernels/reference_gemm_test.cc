// The reference W8A8 op against a second, independent implementation of SPEC sections 2-4
// written here: its own quantizer, an int64 GEMM, and the epilogue in the SPEC order; the result
// is then double-checked against a float64 evaluation of the same formula. Random data and
// awkward shapes (M = 1..67, N = 1, 15, 971, K = 17, 496, 1025), every scheme x input dtype x
// output dtype x bias.
//
// Each run draws a fresh seed; a failure prints it. Replay with
//   QLINEAR_TEST_SEED=<seed> kernels_reference_gemm_test --gtest_filter=<test>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/core/dtype.h"
#include "kernels/core/layer.h"
#include "kernels/core/weights.h"
#include "kernels/reference/reference_w8a8.h"
#include "tests/kernels/test_seed.h"

namespace qlinear {
namespace {

uint64_t base_seed() { return testing::test_seed(); }

std::string seed_trace() {
  return absl::StrCat("QLINEAR_TEST_SEED=", base_seed(), " reproduces this run");
}

// A generator for one test: the run's seed mixed with a per-test stream id.
std::mt19937_64 rng_for(uint64_t stream) {
  const uint64_t s = base_seed();
  std::seed_seq seq{static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32),
                    static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  return std::mt19937_64(seq);
}

// ---------------------------------------------------------------------------------------------
// The independent implementation.

// fp32 -> int8 the way the SPEC writes it: rne, then saturate (NaN -> 0 as in cvt.rni.sat).
int64_t rne_to_int64(float v) {
  if (std::isnan(v)) return 0;
  const float r = std::nearbyintf(v);
  if (r >= 9.2e18f) return INT64_MAX;
  if (r <= -9.2e18f) return INT64_MIN;
  return static_cast<int64_t>(r);
}
int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

struct Quantized {
  std::vector<int8_t> xq;    // [M, K]
  std::vector<float> sa;     // [M]
  std::vector<int32_t> azp;  // [M], 0 for symmetric schemes
};

Quantized quantize_oracle(const LayerConfig& c, const std::vector<float>& x, int64_t m) {
  const int64_t k = c.k;
  Quantized q{std::vector<int8_t>(m * k), std::vector<float>(m), std::vector<int32_t>(m, 0)};
  for (int64_t r = 0; r < m; ++r) {
    const float* row = &x[r * k];
    int8_t* out = &q.xq[r * k];
    if (c.scheme == Scheme::kDynamicSymmetric) {
      float absmax = 0.f;
      for (int64_t i = 0; i < k; ++i) absmax = std::max(absmax, std::fabs(row[i]));
      q.sa[r] = absmax / 127.f;
      const float inv = absmax == 0.f ? 0.f : 127.f / absmax;
      for (int64_t i = 0; i < k; ++i) out[i] = clamp64(rne_to_int64(row[i] * inv), -128, 127);
    } else if (c.scheme == Scheme::kStaticSymmetric) {
      q.sa[r] = c.input_scale;
      for (int64_t i = 0; i < k; ++i) {
        out[i] = clamp64(rne_to_int64(row[i] / c.input_scale), -128, 127);
      }
    } else {
      float s;
      int64_t zp;
      if (c.scheme == Scheme::kStaticAsymmetric) {
        s = c.input_scale;
        zp = c.input_zero_point;
      } else {
        float mn = row[0], mx = row[0];
        for (int64_t i = 0; i < k; ++i) {
          mn = std::min(mn, row[i]);
          mx = std::max(mx, row[i]);
        }
        s = (mx - mn) / 255.f;
        zp = s == 0.f ? 0 : clamp64(rne_to_int64(-128.f - mn / s), INT32_MIN, INT32_MAX);
      }
      q.sa[r] = s;
      q.azp[r] = static_cast<int32_t>(zp);
      if (s == 0.f) continue;  // constant row: xq = 0 (already), azp = 0
      const float inv = 1.f / s;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t v = clamp64(rne_to_int64(row[i] * inv), INT32_MIN, INT32_MAX) + zp;
        out[i] = clamp64(v, -128, 127);
      }
    }
  }
  return q;
}

std::vector<int64_t> gemm_oracle(const std::vector<int8_t>& xq, const std::vector<int8_t>& w,
                                 int64_t m, int64_t n, int64_t k) {
  std::vector<int64_t> acc(m * n);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      int64_t s = 0;
      for (int64_t i = 0; i < k; ++i) s += int64_t{xq[r * k + i]} * int64_t{w[c * k + i]};
      acc[r * n + c] = s;
    }
  }
  return acc;
}

double ulp_of(double v, DType t) {
  const int p = t == DType::kF32 ? 24 : t == DType::kF16 ? 11 : 8;
  const int emin = t == DType::kF16 ? -14 : -126;
  const int e = v == 0 ? emin : std::max(std::ilogb(v), emin);
  return std::ldexp(1.0, e - p + 1);
}

// Output element i as raw bits (for bit-exact comparison) and as a double.
uint32_t out_bits(const std::vector<uint8_t>& y, DType t, int64_t i) {
  if (t == DType::kF32) {
    uint32_t u;
    std::memcpy(&u, &y[i * 4], 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, &y[i * 2], 2);
  return h;
}
uint32_t to_bits(float v, DType t) {
  return t == DType::kF32 ? f32_bits(v) : t == DType::kF16 ? f32_to_f16(v) : f32_to_bf16(v);
}
double from_bits(uint32_t b, DType t) {
  return t == DType::kF32   ? f32_from_bits(b)
         : t == DType::kF16 ? f16_to_f32(static_cast<uint16_t>(b))
                            : bf16_to_f32(static_cast<uint16_t>(b));
}

// ---------------------------------------------------------------------------------------------
// Random problems.

struct Problem {
  LayerSpec spec;
  std::vector<int8_t> w;
  int64_t m = 0;
  DType x_dtype = DType::kF32;
  std::vector<uint8_t> x_raw;  // [M, K] in x_dtype
  std::vector<float> x;        // the same values widened to fp32 (what a kernel reads)
};

Problem make_problem(std::mt19937_64& rng, Scheme scheme, DType x_dtype, bool bias, int64_t m,
                     int64_t n, int64_t k) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::uniform_int_distribution<int> i8(-128, 127);
  auto log_uniform = [&](float lo, float hi) { return std::exp2(lo + (hi - lo) * unit(rng)); };

  Problem p;
  p.m = m;
  p.x_dtype = x_dtype;
  LayerSpec& s = p.spec;
  s.n = n;
  s.k = k;
  s.scheme = scheme;
  // Per-channel scales, or occasionally per tensor.
  if (unit(rng) < 0.2f) {
    s.weight_scale = {log_uniform(-10.f, -5.f)};
  } else {
    for (int64_t i = 0; i < n; ++i) s.weight_scale.push_back(log_uniform(-10.f, -5.f));
    s.weight_scale_shape = {n};
  }
  if (bias) {
    const float b = log_uniform(-4.f, 4.f);
    for (int64_t i = 0; i < n; ++i) s.bias.push_back(normal(rng) * b);
  }
  float static_scale = 0.f;
  if (is_static(scheme)) {
    static_scale = log_uniform(-8.f, 2.f);
    s.has_input_scale = true;
    s.input_scale = static_scale;
  }
  int32_t zp = 0;
  if (scheme == Scheme::kStaticAsymmetric) {
    zp = std::uniform_int_distribution<int32_t>(-40, 40)(rng);
    s.has_input_zero_point = true;
    s.input_zero_point = zp;
  }
  p.w.resize(n * k);
  for (int8_t& v : p.w) v = static_cast<int8_t>(i8(rng));

  std::vector<float> x(m * k);
  for (int64_t r = 0; r < m; ++r) {
    float* row = &x[r * k];
    const float special = unit(rng);
    if (special < 0.06f) {
      std::fill(row, row + k, 0.f);  // all-zero row
      continue;
    }
    if (special < 0.12f) {
      std::fill(row, row + k, normal(rng) * log_uniform(-4.f, 4.f));  // constant row
      continue;
    }
    if (is_static(scheme)) {
      // Centred on the zero point's level, wide enough that the tails saturate.
      const float spread = static_scale * log_uniform(3.f, 7.f);
      const float centre = -static_cast<float>(zp) * static_scale;
      for (int64_t i = 0; i < k; ++i) row[i] = centre + normal(rng) * spread;
    } else {
      const float scale = log_uniform(-8.f, 8.f);
      const float offset = scheme == Scheme::kDynamicAsymmetric ? normal(rng) * 2.f * scale : 0.f;
      for (int64_t i = 0; i < k; ++i) row[i] = offset + normal(rng) * scale;
    }
  }
  // Round to the input dtype; the widened values are what every kernel quantizes.
  p.x_raw.resize(m * k * dtype_size(x_dtype));
  p.x.resize(m * k);
  for (int64_t i = 0; i < m * k; ++i) {
    store_from_f32(p.x_raw.data(), x_dtype, i, x[i]);
    p.x[i] = load_as_f32(p.x_raw.data(), x_dtype, i);
  }
  return p;
}

std::string problem_str(const Problem& p, DType y_dtype) {
  return absl::StrCat(scheme_name(p.spec.scheme), " x=", dtype_name(p.x_dtype),
                      " y=", dtype_name(y_dtype), " bias=", !p.spec.bias.empty(), " M=", p.m,
                      " N=", p.spec.n, " K=", p.spec.k,
                      p.spec.weight_scale.size() == 1 ? " per-tensor sb" : "");
}

// Runs the reference on `p` and checks every intermediate and output against the oracle.
void check_problem(const Problem& p, DType y_dtype) {
  SCOPED_TRACE(problem_str(p, y_dtype));
  const int64_t m = p.m, n = p.spec.n, k = p.spec.k;
  auto built = build_layer_weights(p.spec, p.w);
  ASSERT_TRUE(built.ok()) << built.status();
  const LayerWeights& lw = **built;

  // Quantization: xq, sa, azp bit-exact.
  const Quantized q = quantize_oracle(lw.config, p.x, m);
  std::vector<int8_t> xq(m * k);
  std::vector<float> sa(m, -1.f);
  std::vector<int32_t> azp(m, -999);
  ASSERT_TRUE(reference::quantize_activations(lw.config, p.x_raw.data(), p.x_dtype, m, xq.data(),
                                              sa.data(), azp.data())
                  .ok());
  for (int64_t r = 0; r < m; ++r) {
    ASSERT_EQ(f32_bits(sa[r]), f32_bits(q.sa[r])) << "sa row " << r;
    if (is_asymmetric(p.spec.scheme)) {
      ASSERT_EQ(azp[r], q.azp[r]) << "azp row " << r;
    }
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_EQ(int{xq[r * k + i]}, int{q.xq[r * k + i]}) << "xq row " << r << " col " << i;
    }
  }
  if (!is_asymmetric(p.spec.scheme)) {
    const int lowest = p.spec.scheme == Scheme::kDynamicSymmetric ? -127 : -128;
    for (int8_t v : q.xq) ASSERT_GE(int{v}, lowest);
  }

  // GEMM: exact against int64.
  const std::vector<int64_t> acc64 = gemm_oracle(q.xq, p.w, m, n, k);
  std::vector<int32_t> acc(m * n);
  reference::gemm_s8s8_s32(q.xq.data(), p.w.data(), m, n, k, acc.data());
  for (int64_t i = 0; i < m * n; ++i) {
    ASSERT_LE(std::llabs(acc64[i]), int64_t{INT32_MAX});
    ASSERT_EQ(int64_t{acc[i]}, acc64[i]) << "acc m=" << i / n << " n=" << i % n;
  }

  // The whole op.
  std::vector<uint8_t> y(m * n * dtype_size(y_dtype), 0xcd);
  std::vector<float> sa_out(m, -1.f);
  std::vector<int32_t> azp_out(m, -999);
  RunArgs args;
  args.x = p.x_raw.data();
  args.x_dtype = p.x_dtype;
  args.m = m;
  args.y = y.data();
  args.y_dtype = y_dtype;
  args.sa = sa_out.data();
  args.azp = azp_out.data();
  ASSERT_TRUE(reference::w8a8_linear(lw, args).ok());
  for (int64_t r = 0; r < m; ++r) {
    ASSERT_EQ(f32_bits(sa_out[r]), f32_bits(q.sa[r])) << "sa row " << r;
    if (is_asymmetric(p.spec.scheme)) {
      ASSERT_EQ(azp_out[r], q.azp[r]) << "azp row " << r;
    }
  }

  // Epilogue inputs derived here, not taken from the layer: sb [N], column sums in int64.
  std::vector<float> sb(n);
  for (int64_t c = 0; c < n; ++c) {
    sb[c] = p.spec.weight_scale.size() == 1 ? p.spec.weight_scale[0] : p.spec.weight_scale[c];
  }
  std::vector<int64_t> colsum(n, 0);
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t i = 0; i < k; ++i) colsum[c] += p.w[c * k + i];
  }
  const bool has_bias = !p.spec.bias.empty();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      const int64_t i = r * n + c;
      int64_t t = acc64[i];
      if (p.spec.scheme == Scheme::kStaticAsymmetric) {
        t -= int64_t{p.spec.input_zero_point} * colsum[c];
      } else if (p.spec.scheme == Scheme::kDynamicAsymmetric) {
        t -= int64_t{q.azp[r]} * colsum[c];
      }
      ASSERT_LE(std::llabs(t), int64_t{INT32_MAX}) << "t out of int32 range for this data";
      const float bias_f =
          has_bias ? static_cast<float>(from_bits(to_bits(p.spec.bias[c], y_dtype), y_dtype)) : 0.f;
      // SPEC section 4, in its order.
      const float scaled = sb[c] * static_cast<float>(t);
      float v;
      if (!is_asymmetric(p.spec.scheme) && !has_bias) {
        v = q.sa[r] * scaled;
      } else {
        v = std::fmaf(q.sa[r], scaled, bias_f);
      }
      const uint32_t want = to_bits(v, y_dtype);
      const uint32_t got = out_bits(y, y_dtype, i);
      ASSERT_EQ(got, want) << "y m=" << r << " n=" << c << ": got " << from_bits(got, y_dtype)
                           << ", SPEC order gives " << from_bits(want, y_dtype) << " (acc "
                           << acc64[i] << ", t " << t << ", sa " << q.sa[r] << ", sb " << sb[c]
                           << ", bias_f " << bias_f << ")";

      // Double check in float64: the fp32 order may cost a few fp32 roundings of the product
      // (f32(t), sb*, the fma) and one rounding to the output dtype.
      const double prod = double{q.sa[r]} * double{sb[c]} * static_cast<double>(t);
      const double yd = prod + double{bias_f};
      const double got_d = from_bits(got, y_dtype);
      if (std::isinf(got_d)) {
        ASSERT_EQ(y_dtype, DType::kF16) << "only fp16 output may overflow here";
        ASSERT_GE(std::fabs(yd), 65504.0);
        ASSERT_EQ(std::signbit(got_d), std::signbit(yd));
        continue;
      }
      const double tol = ulp_of(std::max(std::fabs(yd), std::fabs(got_d)), y_dtype) +
                         4 * std::ldexp(std::fabs(prod), -24);
      ASSERT_LE(std::fabs(got_d - yd), tol)
          << "y m=" << r << " n=" << c << ": got " << got_d << ", float64 gives " << yd;
    }
  }
}

// ---------------------------------------------------------------------------------------------

using Combo = std::tuple<Scheme, DType, DType, bool>;  // scheme, x dtype, y dtype, bias

class ReferenceGemm : public ::testing::TestWithParam<Combo> {};

TEST_P(ReferenceGemm, MatchesIndependentImplementation) {
  SCOPED_TRACE(seed_trace());
  const auto [scheme, x_dtype, y_dtype, bias] = GetParam();
  const uint64_t stream = static_cast<uint64_t>(scheme) * 100 +
                          static_cast<uint64_t>(x_dtype) * 10 + static_cast<uint64_t>(y_dtype) * 2 +
                          (bias ? 1 : 0);
  std::mt19937_64 rng = rng_for(stream);
  const int64_t ks[3] = {17, 496, 1025};
  const int64_t ns[3] = {1, 15, 971};
  // Every combination sees all three N; K rotates so that each K meets each N across the suite.
  for (int j = 0; j < 3; ++j) {
    const int64_t n = ns[j];
    const int64_t k = ks[(stream + j) % 3];
    // M = 1 and M = 67 both occur in every run.
    const int64_t m_max = 67;
    int64_t m = std::uniform_int_distribution<int64_t>(1, m_max)(rng);
    if (j == 1 && stream % 4 == 0) m = 67;
    if (j == 0 && stream % 4 == 1) m = 1;
    check_problem(make_problem(rng, scheme, x_dtype, bias, m, n, k), y_dtype);
    if (HasFatalFailure()) return;
  }
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  const auto [scheme, x_dtype, y_dtype, bias] = info.param;
  return absl::StrCat(scheme_name(scheme), "_", dtype_name(x_dtype), "_to_", dtype_name(y_dtype),
                      bias ? "_bias" : "");
}

INSTANTIATE_TEST_SUITE_P(
    AllSchemesAndDtypes, ReferenceGemm,
    ::testing::Combine(::testing::Values(Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric,
                                         Scheme::kDynamicAsymmetric, Scheme::kStaticAsymmetric),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Bool()),
    combo_name);

TEST(ReferenceGemmShapes, EveryMFrom1To67) {
  SCOPED_TRACE(seed_trace());
  std::mt19937_64 rng = rng_for(7001);
  const Scheme schemes[4] = {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric,
                             Scheme::kDynamicAsymmetric, Scheme::kStaticAsymmetric};
  const DType dtypes[3] = {DType::kF32, DType::kF16, DType::kBF16};
  for (int64_t m = 1; m <= 67; ++m) {
    const Scheme s = schemes[m % 4];
    const DType xd = dtypes[m % 3], yd = dtypes[(m / 3) % 3];
    check_problem(make_problem(rng, s, xd, m % 2 == 0, m, 1 + 2 * (m % 8), 17 + 2 * (m % 5)), yd);
    if (HasFatalFailure()) return;
  }
}

TEST(ReferenceGemmShapes, LargestKAccumulatesExactly) {
  // K = 131071 is the largest K the SPEC accepts: 128 * 128 * K = 2147467264 < 2^31.
  // Static symmetric with s = 1 and x = -128 gives xq = -128 in every column.
  LayerSpec spec;
  spec.n = 2;
  spec.k = kMaxK;
  spec.scheme = Scheme::kStaticSymmetric;
  spec.has_input_scale = true;
  spec.input_scale = 1.f;
  spec.weight_scale = {1.f};
  std::vector<int8_t> w(2 * kMaxK);
  std::fill(w.begin(), w.begin() + kMaxK, int8_t{-128});
  std::fill(w.begin() + kMaxK, w.end(), int8_t{127});
  auto lw = build_layer_weights(spec, w);
  ASSERT_TRUE(lw.ok()) << lw.status();
  const std::vector<float> x(kMaxK, -128.f);
  float y[2];
  RunArgs args;
  args.x = x.data();
  args.x_dtype = DType::kF32;
  args.m = 1;
  args.y = y;
  args.y_dtype = DType::kF32;
  ASSERT_TRUE(reference::w8a8_linear(**lw, args).ok());
  // acc = 16384 * 131071 = 2147467264 and -16256 * 131071 = -2130690176; y = f32(acc).
  EXPECT_EQ(y[0], static_cast<float>(2147467264));
  EXPECT_EQ(y[1], static_cast<float>(-2130690176));
  std::vector<int8_t> xq(kMaxK, int8_t{-128});
  int32_t acc[2];
  reference::gemm_s8s8_s32(xq.data(), w.data(), 1, 2, kMaxK, acc);
  EXPECT_EQ(acc[0], 2147467264);
  EXPECT_EQ(acc[1], -2130690176);
}

// SPEC section 5: results never depend on batching. Each row computed alone gives the same bits
// as the row inside the batch.
TEST(ReferenceGemmShapes, RowsDoNotDependOnTheBatch) {
  SCOPED_TRACE(seed_trace());
  std::mt19937_64 rng = rng_for(7002);
  for (Scheme s : {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric, Scheme::kDynamicAsymmetric,
                   Scheme::kStaticAsymmetric}) {
    SCOPED_TRACE(std::string(scheme_name(s)));
    const int64_t m = 13, n = 9, k = 33;
    const Problem p = make_problem(rng, s, DType::kBF16, true, m, n, k);
    auto lw = build_layer_weights(p.spec, p.w);
    ASSERT_TRUE(lw.ok()) << lw.status();
    std::vector<uint16_t> y_all(m * n);
    RunArgs args;
    args.x = p.x_raw.data();
    args.x_dtype = DType::kBF16;
    args.m = m;
    args.y = y_all.data();
    args.y_dtype = DType::kBF16;
    ASSERT_TRUE(reference::w8a8_linear(**lw, args).ok());
    for (int64_t r = 0; r < m; ++r) {
      std::vector<uint16_t> y_one(n);
      args.x = p.x_raw.data() + r * k * 2;
      args.m = 1;
      args.y = y_one.data();
      ASSERT_TRUE(reference::w8a8_linear(**lw, args).ok());
      for (int64_t c = 0; c < n; ++c) ASSERT_EQ(y_one[c], y_all[r * n + c]) << r << "," << c;
    }
  }
}

// The registered kernel object runs the same function.
TEST(ReferenceKernel, PreparedRunMatchesW8a8Linear) {
  SCOPED_TRACE(seed_trace());
  std::mt19937_64 rng = rng_for(7003);
  const Problem p = make_problem(rng, Scheme::kDynamicAsymmetric, DType::kF16, true, 5, 31, 65);
  auto lw = build_layer_weights(p.spec, p.w);
  ASSERT_TRUE(lw.ok()) << lw.status();
  const auto kernel = reference::make_reference_kernel();
  EXPECT_EQ(kernel->name(), "cpu.reference");
  ProblemShape shape{5, 31, 65, DType::kF16, DType::kF16};
  ASSERT_TRUE(kernel->can_implement((*lw)->config, shape).ok());
  auto prepared = kernel->prepare(**lw);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  std::vector<uint16_t> y1(5 * 31), y2(5 * 31);
  float sa1[5], sa2[5];
  int32_t azp1[5], azp2[5];
  RunArgs args;
  args.x = p.x_raw.data();
  args.x_dtype = DType::kF16;
  args.m = 5;
  args.y_dtype = DType::kF16;
  args.y = y1.data();
  args.sa = sa1;
  args.azp = azp1;
  RunTimings timings;
  ASSERT_TRUE((*prepared)->run(args, &timings).ok());
  args.y = y2.data();
  args.sa = sa2;
  args.azp = azp2;
  ASSERT_TRUE(reference::w8a8_linear(**lw, args).ok());
  EXPECT_EQ(y1, y2);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(f32_bits(sa1[r]), f32_bits(sa2[r]));
    EXPECT_EQ(azp1[r], azp2[r]);
  }
  EXPECT_GE(timings.quantize_ns, 0);
  EXPECT_GE(timings.gemm_ns, 0);

  // Non-finite input is an error from run too, never a crash.
  std::vector<uint8_t> bad = p.x_raw;
  const uint16_t nan16 = 0x7e00;
  std::memcpy(&bad[(3 * 65 + 10) * 2], &nan16, 2);
  args.x = bad.data();
  const absl::Status s = (*prepared)->run(args, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("row 3"), absl::string_view::npos) << s;
}

TEST(ReferenceKernel, CanImplementLimits) {
  const auto kernel = reference::make_reference_kernel();
  LayerConfig c;
  c.n = 3;
  c.k = kMaxK;
  EXPECT_TRUE(kernel->can_implement(c, ProblemShape{1, 3, kMaxK}).ok());
  EXPECT_TRUE(kernel->is_supported(HostInfo{}).ok());
  const absl::Status zero_m = kernel->can_implement(c, ProblemShape{0, 3, kMaxK});
  EXPECT_FALSE(zero_m.ok());
  EXPECT_NE(zero_m.message().find("M"), absl::string_view::npos) << zero_m;
  c.k = kMaxK + 1;
  const absl::Status big_k = kernel->can_implement(c, ProblemShape{1, 3, kMaxK + 1});
  EXPECT_FALSE(big_k.ok());
  EXPECT_NE(big_k.message().find("131071"), absl::string_view::npos) << big_k;
}

}  // namespace
}  // namespace qlinear
