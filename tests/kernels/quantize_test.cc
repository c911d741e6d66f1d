// Activation quantization of the reference kernel (SPEC section 2), checked against values worked
// out by hand. Every optimized kernel must match these functions bit for bit on xq, sa and azp, so
// each case below pins one rule: the rounding (half to even), the exact fp32 operation (multiply
// by 127/absmax, true division, multiply by 1/s), saturation, and the degenerate rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/dtype.h"
#include "kernels/core/layer.h"
#include "kernels/core/weights.h"
#include "kernels/reference/reference_w8a8.h"
#include "tests/kernels/test_seed.h"

namespace qlinear {
namespace {

using reference::quantize_activations;
using reference::quantize_row;
using reference::rne;
using reference::sat32;
using reference::sat8;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Quantized {
  std::vector<int> xq;  // int, so that failures print numbers rather than characters
  float sa = -1.f;
  int32_t azp = -12345;
};

LayerConfig config_for(Scheme scheme, int64_t k, float input_scale = 0.f, int32_t zp = 0) {
  LayerConfig c;
  c.n = 1;
  c.k = k;
  c.scheme = scheme;
  c.input_scale = input_scale;
  c.input_zero_point = zp;
  return c;
}

Quantized quantize(const LayerConfig& c, const std::vector<float>& row) {
  std::vector<int8_t> xq(row.size(), int8_t{99});
  Quantized q;
  EXPECT_TRUE(
      quantize_row(c, row.data(), static_cast<int64_t>(row.size()), xq.data(), &q.sa, &q.azp));
  q.xq.assign(xq.begin(), xq.end());
  return q;
}

Quantized dyn_sym(const std::vector<float>& row) {
  return quantize(config_for(Scheme::kDynamicSymmetric, row.size()), row);
}
Quantized dyn_asym(const std::vector<float>& row) {
  return quantize(config_for(Scheme::kDynamicAsymmetric, row.size()), row);
}

// ---------------------------------------------------------------------------------------------
// Scalar helpers.

TEST(Rounding, RneIsHalfToEven) {
  EXPECT_EQ(rne(0.5f), 0.f);
  EXPECT_EQ(rne(1.5f), 2.f);
  EXPECT_EQ(rne(2.5f), 2.f);
  EXPECT_EQ(rne(3.5f), 4.f);
  EXPECT_EQ(rne(-0.5f), 0.f);
  EXPECT_TRUE(std::signbit(rne(-0.5f)));
  EXPECT_EQ(rne(-2.5f), -2.f);
  EXPECT_EQ(rne(-3.5f), -4.f);
  EXPECT_EQ(rne(2.5000002f), 3.f);
  EXPECT_EQ(rne(126.5f), 126.f);
  EXPECT_EQ(rne(127.5f), 128.f);
}

TEST(Rounding, Sat32AndSat8) {
  EXPECT_EQ(sat32(kNaN), 0);
  EXPECT_EQ(sat32(kInf), INT32_MAX);
  EXPECT_EQ(sat32(-kInf), INT32_MIN);
  EXPECT_EQ(sat32(3e9f), INT32_MAX);
  EXPECT_EQ(sat32(-3e9f), INT32_MIN);
  EXPECT_EQ(sat32(2147483648.f), INT32_MAX);   // 2^31: first float above INT32_MAX
  EXPECT_EQ(sat32(2147483520.f), 2147483520);  // largest float below 2^31 is exact
  EXPECT_EQ(sat32(-2147483648.f), INT32_MIN);  // -2^31 is exact
  EXPECT_EQ(sat32(-2.5f), -2);
  EXPECT_EQ(sat32(7.5f), 8);
  EXPECT_EQ(sat8(127), 127);
  EXPECT_EQ(sat8(128), 127);
  EXPECT_EQ(sat8(-128), -128);
  EXPECT_EQ(sat8(-129), -128);
  EXPECT_EQ(sat8(INT32_MAX), 127);
  EXPECT_EQ(sat8(INT32_MIN), -128);
}

// ---------------------------------------------------------------------------------------------
// Dynamic symmetric: sa = absmax / 127; inv = 127 / absmax; xq = sat8(rne(x * inv)).

TEST(DynamicSymmetric, TiesRoundHalfToEven) {
  // absmax = 254: sa = 254/127 = 2 and inv = 127/254 = 0.5, both exact. Every x * 0.5 below is
  // exact in fp32, so the products are exact ties:
  //   5 -> 2.5 -> 2;  7 -> 3.5 -> 4;  1 -> 0.5 -> 0;  3 -> 1.5 -> 2;  negatives mirror.
  //   std::round would give 3, 4, 1, 2 (and -3, -1 for the negatives).
  const Quantized q = dyn_sym({254, 5, 7, -5, -7, 1, 3, -1, -3, 0, -254, 9});
  EXPECT_EQ(q.sa, 2.f);
  EXPECT_EQ(q.xq, (std::vector<int>{127, 2, 4, -2, -4, 0, 2, 0, -2, 0, -127, 4}));
}

TEST(DynamicSymmetric, MultipliesBy127OverAbsmax) {
  // absmax = 5.5.
  //   inv = fl(127 / 5.5) = 0x1.71745ep+4 = 23.0909099578857421875
  //   2.75 * inv = 63.500002384185791015625 (exact) -> fl = 0x1.fc0002p+5 = 63.5000038 -> 64.
  //   5.5 * inv = 127.00000476837158203125 -> fl = 127.0000076 -> 127.
  // The alternatives the SPEC rules out give 63 instead:
  //   sa = fl(5.5 / 127) = 0x1.62c58cp-5; 2.75 / sa = 63.49999750... -> fl 63.4999962 -> 63;
  //   fl(1 / sa) * 2.75 -> fl 63.4999962 -> 63.
  const Quantized q = dyn_sym({5.5f, 2.75f, -2.75f, -5.5f, 0.f});
  EXPECT_EQ(q.sa, 0x1.62c58cp-5f);
  EXPECT_EQ(q.xq, (std::vector<int>{127, 64, -64, -127, 0}));
}

TEST(DynamicSymmetric, AllZeroRowGivesZeroScaleAndNoNaN) {
  // absmax = 0: sa = 0/127 = 0, inv is defined as 0 (not 127/0 = Inf, whose 0 * Inf is NaN).
  const Quantized q = dyn_sym({0.f, -0.f, 0.f});
  EXPECT_EQ(q.sa, 0.f);
  EXPECT_FALSE(std::isnan(q.sa));
  EXPECT_EQ(q.xq, (std::vector<int>{0, 0, 0}));
}

TEST(DynamicSymmetric, NeverProducesMinus128) {
  // |x| <= absmax, so |x * 127/absmax| <= 127 * (1 + 2^-23) which rounds to at most 127.
  EXPECT_EQ(dyn_sym({-1.f, 1.f}).xq, (std::vector<int>{-127, 127}));
  // -3 is the absmax: fl(127/3) = 42.33333206; -3 * that = -126.9999962 -> fl -127 -> -127;
  // 1 * that = 42.33 -> 42.
  EXPECT_EQ(dyn_sym({-3.f, 1.f}).xq, (std::vector<int>{-127, 42}));
  SCOPED_TRACE(testing::seed_trace());
  std::mt19937_64 rng(testing::test_seed());
  std::uniform_real_distribution<float> mag(-30.f, 30.f);
  std::normal_distribution<float> nd;
  for (int trial = 0; trial < 2000; ++trial) {
    const float scale = std::exp2(mag(rng));
    std::vector<float> row(33);
    for (float& v : row) v = nd(rng) * scale;
    row[trial % 33] = -std::fabs(row[trial % 33]) * 4.f;  // a negative absmax, usually
    const Quantized q = dyn_sym(row);
    for (int v : q.xq) ASSERT_GE(v, -127) << "trial " << trial;
  }
}

TEST(DynamicSymmetric, AbsmaxSoSmallThat127OverItOverflows) {
  // For absmax < 127 / FLT_MAX (about 3.7e-37) the SPEC formula's inv = 127/absmax is +Inf:
  // nonzero x give +-Inf, which saturate to 127 / -128 (as CUDA's cvt.rni.sat does), and x = 0
  // gives 0 * Inf = NaN, which must convert to 0 without undefined behaviour.
  const Quantized q = dyn_sym({-1e-38f, 5e-39f, 0.f});
  EXPECT_EQ(q.sa, 1e-38f / 127.f);
  EXPECT_EQ(q.xq, (std::vector<int>{-128, 127, 0}));
}

// ---------------------------------------------------------------------------------------------
// Static symmetric: xq = sat8(rne(x / s)), a true division; sa = s.

TEST(StaticSymmetric, TiesAndSaturation) {
  // s = 0.5: x / 0.5 = 2x exactly.
  //   1.25 -> 2.5 -> 2;  1.75 -> 3.5 -> 4;  -1.25 -> -2.5 -> -2;
  //   63.75 -> 127.5 -> 128 -> 127;  100 -> 200 -> 127;
  //   -64 -> -128 (a static scheme may produce -128);  -64.25 -> -128.5 -> -128;  -100 -> -128.
  const Quantized q =
      quantize(config_for(Scheme::kStaticSymmetric, 10, 0.5f),
               {1.25f, 1.75f, -1.25f, 63.75f, 100.f, -64.f, -64.25f, -100.f, 0.f, -0.75f});
  EXPECT_EQ(q.sa, 0.5f);
  EXPECT_EQ(q.xq, (std::vector<int>{2, 4, -2, 127, 127, -128, -128, -128, 0, -2}));
}

TEST(StaticSymmetric, UsesTrueDivision) {
  // s = 0.3f = 0x1.333334p-2 = 0.300000011920928955078125.
  //   -8.25 / s = -27.4999989072... -> fl = -0x1.b7fffep+4 = -27.4999981 -> rne -27.
  // Multiplying by the reciprocal instead would round differently:
  //   fl(1/s) = 0x1.aaaaaap+1 = 3.33333325386047363281; -8.25 * that = -27.4999993443489...
  //   -> fl = -27.5 -> rne -28.
  const float s = 0.3f;
  ASSERT_EQ(s, 0x1.333334p-2f);
  ASSERT_EQ(rne(-8.25f * (1.f / s)), -28.f);  // the rounding a reciprocal would give
  const Quantized q = quantize(config_for(Scheme::kStaticSymmetric, 2, s), {-8.25f, 8.25f});
  EXPECT_EQ(q.xq, (std::vector<int>{-27, 27}));
  EXPECT_EQ(q.sa, s);
}

// ---------------------------------------------------------------------------------------------
// Static asymmetric: inv = 1/s; xq = sat8(sat32(rne(x * inv)) + azp); sa = s; azp from the layer.

TEST(StaticAsymmetric, TiesSaturationAndZeroPoint) {
  // s = 0.5 (inv = 2), azp = 5:
  //   1.25 -> 2.5 -> 2 -> 7;  61.25 -> 122.5 -> 122 -> 127;  61.75 -> 123.5 -> 124 -> 129 -> 127;
  //   -66.75 -> -133.5 -> -134 -> -129 -> -128;  -66.5 -> -133 -> -128;  0 -> 5;  -0.75 -> -2 -> 3.
  const Quantized q = quantize(config_for(Scheme::kStaticAsymmetric, 7, 0.5f, 5),
                               {1.25f, 61.25f, 61.75f, -66.75f, -66.5f, 0.f, -0.75f});
  EXPECT_EQ(q.sa, 0.5f);
  EXPECT_EQ(q.azp, 5);
  EXPECT_EQ(q.xq, (std::vector<int>{7, 122 + 5, 127, -128, -128, 5, 3}));
}

TEST(StaticAsymmetric, MinusZeroPoint128ProducesMinus128) {
  // azp = -128: x = 0 -> 0 - 128 = -128; x = -1 (inv 2) -> -2 - 128 -> -128.
  const Quantized q =
      quantize(config_for(Scheme::kStaticAsymmetric, 3, 0.5f, -128), {0.f, -1.f, 127.5f});
  // 127.5 * 2 = 255 -> 255 - 128 = 127.
  EXPECT_EQ(q.xq, (std::vector<int>{-128, -128, 127}));
}

TEST(StaticAsymmetric, MultipliesByTheReciprocal) {
  // Same s = 0.3f and x = -8.25 as UsesTrueDivision: here the SPEC says x * (1/s), which is
  // fl(-27.49999934) = -27.5 -> rne -28; plus azp 3 -> -25 (a division would give -24).
  const Quantized q = quantize(config_for(Scheme::kStaticAsymmetric, 1, 0.3f, 3), {-8.25f});
  EXPECT_EQ(q.xq, (std::vector<int>{-25}));
  EXPECT_EQ(q.azp, 3);
}

TEST(StaticAsymmetric, SaturatesBeforeAddingTheZeroPoint) {
  // x * inv = 1e30 * 2 -> sat32 -> INT32_MAX; adding azp = 0 keeps 127.
  const Quantized q = quantize(config_for(Scheme::kStaticAsymmetric, 2, 0.5f, 0), {1e30f, -1e30f});
  EXPECT_EQ(q.xq, (std::vector<int>{127, -128}));
}

// ---------------------------------------------------------------------------------------------
// Dynamic asymmetric: s = (mx - mn) / 255; azp = rne(-128 - mn / s); inv = 1/s;
// xq = sat8(sat32(rne(x * inv)) + azp).

TEST(DynamicAsymmetric, UnitScale) {
  // mn = 0, mx = 255: s = 255/255 = 1, azp = rne(-128 - 0/1) = -128, inv = 1.
  //   0 -> -128;  255 -> 127;  2.5 -> 2 -> -126;  3.5 -> 4 -> -124;  100 -> -28.
  const Quantized q = dyn_asym({0.f, 255.f, 2.5f, 3.5f, 100.f});
  EXPECT_EQ(q.sa, 1.f);
  EXPECT_EQ(q.azp, -128);
  EXPECT_EQ(q.xq, (std::vector<int>{-128, 127, -126, -124, -28}));
}

TEST(DynamicAsymmetric, ZeroPointTieAndSaturation) {
  // mn = -1.5, mx = 253.5: s = 255/255 = 1; azp = rne(-128 + 1.5) = rne(-126.5) = -126 (even).
  //   -1.5 -> rne -2 -> -128;  253.5 -> 254 -> 128 -> 127 (saturated);
  //   0.5 -> 0 -> -126;  -0.5 -> -0 -> -126;  1.5 -> 2 -> -124.
  const Quantized q = dyn_asym({-1.5f, 253.5f, 0.5f, -0.5f, 1.5f});
  EXPECT_EQ(q.sa, 1.f);
  EXPECT_EQ(q.azp, -126);
  EXPECT_EQ(q.xq, (std::vector<int>{-128, 127, -126, -126, -124}));
}

TEST(DynamicAsymmetric, ZeroPointFormulaInFp32) {
  // mn = -1, mx = 1: s = fl(2/255) = 0x1.010102p-7 = 0.0078431377187371254 (above 2/255).
  //   mn / s = fl(-127.4999924598) = -0x1.fdfffep+6 = -127.49999237060546875
  //   -128 - that = -0.50000762939453125 (exact) -> rne -> -1.
  // (Exact arithmetic, -128 + 127.5 = -0.5, would round to 0.)
  //   inv = fl(1/s) = 0x1.fdfffep+6 = 127.49999237...
  //   -1 -> -127.4999924 -> -127 -> -128;  -0.5 -> -63.7499962 -> -64 -> -65;  0 -> -1;
  //   0.25 -> 31.8749981 -> 32 -> 31;  0.5 -> 63.7499962 -> 64 -> 63;  1 -> 127 -> 126.
  const Quantized q = dyn_asym({-1.f, -0.5f, 0.f, 0.25f, 0.5f, 1.f});
  EXPECT_EQ(q.sa, 0x1.010102p-7f);
  EXPECT_EQ(q.azp, -1);
  EXPECT_EQ(q.xq, (std::vector<int>{-128, -65, -1, 31, 63, 126}));
}

TEST(DynamicAsymmetric, ZeroPointRoundsAfterTheSubtraction) {
  // mn = 0.25, mx = 8.75: s = fl(8.5 / 255) = 0x1.111112p-5 = 0.0333333350718...
  //   mn / s = 7.49999960884... -> fl 0x1.dffffep+2 = 7.4999995231628
  //   -128 - that = -135.4999995231628 -> fl -135.5 (the ulp at 128 is 2^-16) -> rne -136.
  // Rounding mn / s first would give -128 - rne(7.4999995) = -135.
  //   inv = fl(1/s) = 0x1.dffffep+4 = 29.999998;
  //   0.25 -> 7.4999995 -> 7 - 136 = -129 -> -128;  8.75 -> 262.49997 -> 262 - 136 = 126;
  //   4.5 -> 134.99998 -> 135 - 136 = -1;  1 -> 29.999998 -> 30 - 136 = -106.
  const Quantized q = dyn_asym({0.25f, 8.75f, 4.5f, 1.f});
  EXPECT_EQ(q.sa, 0x1.111112p-5f);
  EXPECT_EQ(q.azp, -136);
  EXPECT_EQ(q.xq, (std::vector<int>{-128, 126, -1, -106}));
}

TEST(DynamicAsymmetric, ConstantRowsAreDefined) {
  // mx == mn: s = 0. The row's xq and azp are 0, so acc = 0 and t = 0: the output is the bias.
  for (const std::vector<float>& row : std::vector<std::vector<float>>{
           {3.f, 3.f, 3.f, 3.f}, {-7.25f, -7.25f}, {0.f, 0.f, 0.f}, {1e30f}, {-2.f}}) {
    const Quantized q = dyn_asym(row);
    EXPECT_EQ(q.sa, 0.f);
    EXPECT_EQ(q.azp, 0);
    EXPECT_EQ(q.xq, std::vector<int>(row.size(), 0));
  }
}

TEST(DynamicAsymmetric, ConstantRowOutputIsTheBias) {
  LayerSpec spec;
  spec.n = 3;
  spec.k = 4;
  spec.scheme = Scheme::kDynamicAsymmetric;
  spec.weight_scale = {0.25f};
  spec.bias = {1.5f, -2.f, 1.f + 0x1p-8f};  // the last one is a bf16 tie: rounds to 1.0
  auto lw = build_layer_weights(spec, {1, 2, 3, 4, -5, 6, -7, 8, 127, -128, 127, -128});
  ASSERT_TRUE(lw.ok()) << lw.status();
  const std::vector<float> x = {3.f, 3.f, 3.f, 3.f, -0.5f, -0.5f, -0.5f, -0.5f};
  std::vector<uint16_t> y(6, 0xffff);
  float sa[2];
  int32_t azp[2];
  RunArgs args;
  args.x = x.data();
  args.x_dtype = DType::kF32;
  args.m = 2;
  args.y = y.data();
  args.y_dtype = DType::kBF16;
  args.sa = sa;
  args.azp = azp;
  ASSERT_TRUE(reference::w8a8_linear(**lw, args).ok());
  const std::vector<uint16_t> want = {0x3fc0, 0xc000, 0x3f80};  // 1.5, -2, 1.0
  for (int m = 0; m < 2; ++m) {
    EXPECT_EQ(sa[m], 0.f);
    EXPECT_EQ(azp[m], 0);
    for (int n = 0; n < 3; ++n) EXPECT_EQ(y[m * 3 + n], want[n]) << "m=" << m << " n=" << n;
  }
}

TEST(DynamicSymmetric, AllZeroRowOutputIsTheBias) {
  LayerSpec spec;
  spec.n = 2;
  spec.k = 3;
  spec.weight_scale = {0.5f, -0.25f};
  spec.bias = {0.75f, -3.f};
  auto lw = build_layer_weights(spec, {1, 2, 3, -4, -5, -6});
  ASSERT_TRUE(lw.ok()) << lw.status();
  const std::vector<float> x = {0.f, 0.f, 0.f};
  float y[2] = {kNaN, kNaN};
  RunArgs args;
  args.x = x.data();
  args.x_dtype = DType::kF32;
  args.m = 1;
  args.y = y;
  args.y_dtype = DType::kF32;
  ASSERT_TRUE(reference::w8a8_linear(**lw, args).ok());
  EXPECT_EQ(y[0], 0.75f);
  EXPECT_EQ(y[1], -3.f);

  spec.bias.clear();
  lw = build_layer_weights(spec, {1, 2, 3, -4, -5, -6});
  ASSERT_TRUE(lw.ok()) << lw.status();
  y[0] = y[1] = kNaN;
  ASSERT_TRUE(reference::w8a8_linear(**lw, args).ok());
  EXPECT_EQ(y[0], 0.f);
  EXPECT_EQ(y[1], 0.f);
}

// ---------------------------------------------------------------------------------------------
// Inputs in fp16 and bf16 are widened exactly before quantization.

TEST(QuantizeActivations, WidensHalfPrecisionInputs) {
  // Row 0 in bf16: {254, 5, -7} -> as the fp32 ties test: {127, 2, -4}, sa = 2.
  // Row 1: {0.5, -0.25, 0.125} -> absmax 0.5, inv = 254: {127, -64 (-63.5 -> even), 32 (31.75)}.
  const LayerConfig c = config_for(Scheme::kDynamicSymmetric, 3);
  const uint16_t bf[6] = {0x437e, 0x40a0, 0xc0e0, 0x3f00, 0xbe80, 0x3e00};
  const uint16_t hf[6] = {0x5bf0, 0x4500, 0xc700, 0x3800, 0xb400, 0x3000};
  for (DType t : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    int8_t xq[6];
    float sa[2];
    int32_t azp[2];
    ASSERT_TRUE(quantize_activations(c, t == DType::kBF16 ? bf : hf, t, 2, xq, sa, azp).ok());
    EXPECT_EQ(sa[0], 2.f);
    EXPECT_EQ(sa[1], 0.5f / 127.f);
    EXPECT_EQ(std::vector<int>(xq, xq + 6), (std::vector<int>{127, 2, -4, 127, -64, 32}));
  }
}

// ---------------------------------------------------------------------------------------------
// Non-finite inputs: INVALID_ARGUMENT naming the first bad row, for every scheme and dtype.

uint16_t encode(float v, DType t) { return t == DType::kF16 ? f32_to_f16(v) : f32_to_bf16(v); }

TEST(QuantizeActivations, RejectsNonFiniteNamingTheFirstBadRow) {
  const int64_t m = 4, k = 5;
  for (Scheme scheme : {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric,
                        Scheme::kDynamicAsymmetric, Scheme::kStaticAsymmetric}) {
    const LayerConfig c = config_for(scheme, k, 0.125f, is_asymmetric(scheme) ? 3 : 0);
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (float bad : {kNaN, kInf, -kInf}) {
        for (int64_t bad_row : {0, 1, 2, 3}) {
          SCOPED_TRACE(absl::StrCat(scheme_name(scheme), " ", dtype_name(t), " bad=", bad,
                                    " row=", bad_row));
          std::vector<float> x(m * k);
          for (int64_t i = 0; i < m * k; ++i) x[i] = 0.5f * static_cast<float>(i % 7) - 1.f;
          x[bad_row * k + (bad_row + 2) % k] = bad;
          if (bad_row + 1 < m) x[(bad_row + 1) * k] = kNaN;  // a later bad row is not named
          std::vector<uint16_t> x16(m * k);
          for (int64_t i = 0; i < m * k; ++i) x16[i] = encode(x[i], t);
          const void* xp = t == DType::kF32 ? static_cast<const void*>(x.data()) : x16.data();
          std::vector<int8_t> xq(m * k);
          std::vector<float> sa(m);
          std::vector<int32_t> azp(m);
          const absl::Status s =
              quantize_activations(c, xp, t, m, xq.data(), sa.data(), azp.data());
          EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
          EXPECT_NE(s.message().find(absl::StrCat("row ", bad_row)), absl::string_view::npos) << s;
          if (bad_row + 1 < m) {
            EXPECT_EQ(s.message().find(absl::StrCat("row ", bad_row + 1)), absl::string_view::npos)
                << s;
          }
        }
      }
    }
  }
}

TEST(QuantizeActivations, QuantizeRowReportsNonFinite) {
  for (Scheme scheme : {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric,
                        Scheme::kDynamicAsymmetric, Scheme::kStaticAsymmetric}) {
    const LayerConfig c = config_for(scheme, 3, 1.f, 0);
    for (float bad : {kNaN, kInf, -kInf}) {
      const float row[3] = {1.f, bad, 2.f};
      int8_t xq[3];
      float sa;
      int32_t azp;
      EXPECT_FALSE(quantize_row(c, row, 3, xq, &sa, &azp)) << scheme_name(scheme) << " " << bad;
    }
  }
}

TEST(QuantizeActivations, LargeFiniteValuesAreAccepted) {
  // Finite extremes are valid input; only NaN and +-Inf are rejected.
  const float big = std::numeric_limits<float>::max();
  const LayerConfig c = config_for(Scheme::kDynamicSymmetric, 3);
  const float x[3] = {big, -big, 0.f};
  int8_t xq[3];
  float sa;
  int32_t azp;
  ASSERT_TRUE(quantize_activations(c, x, DType::kF32, 1, xq, &sa, &azp).ok());
  EXPECT_EQ(std::vector<int>(xq, xq + 3), (std::vector<int>{127, -127, 0}));
  EXPECT_EQ(sa, big / 127.f);
}

}  // namespace
}  // namespace qlinear
