// The reference epilogue (SPEC section 4): the exact fp32 operation order per case, where the one
// FMA sits, how the bias is rounded, fp16 overflow, and the asymmetric corrections, including how
// build_layer_weights folds the static zero point into azp_adj. Each value is chosen so that a
// different order or rounding gives different bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/layer.h"
#include "kernels/core/weights.h"
#include "kernels/reference/reference_w8a8.h"

namespace qlinear {
namespace {

using reference::epilogue_value;

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Symmetric: out(sa * (sb * f32(acc))) and out(fma(sa, sb * f32(acc), bias_f)).

TEST(EpilogueOrder, SymmetricScalesAccByWeightScaleFirst) {
  // sa = 0.1f = 13421773 * 2^-27, sb = 0.01f = 5368709 * 2^-29, acc = 9.
  //   SPEC: sb * 9 = 0.08999999798834... -> fl 0x1.70a3d6p-4 = 0.08999999612569809
  //         sa * that = 0.00899999974668... -> fl 0x1.26e978p-7 = 0.00899999961256981
  //   (sa * sb) * 9: fl(sa * sb) = 0x1.0624dep-10; * 9 = 0.00900000042748 -> 0x1.26e97ap-7
  //   sb * (sa * 9): fl(sa * 9) = 0x1.cccccep-1; * sb = 0.00900000015646 -> 0x1.26e97ap-7
  const float sa = 0.1f, sb = 0.01f;
  ASSERT_EQ((sa * sb) * 9.f, 0x1.26e97ap-7f);  // the orders the SPEC does not use
  ASSERT_EQ(sb * (sa * 9.f), 0x1.26e97ap-7f);
  for (Scheme s : {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric}) {
    // azp and azp_adj are ignored by symmetric schemes: pass values that would change the result.
    EXPECT_EQ(epilogue_value(s, 9, sa, 77, sb, 1000, false, 0.f), 0x1.26e978p-7f) << scheme_name(s);
    EXPECT_EQ(epilogue_value(s, -9, sa, 0, sb, 0, false, 0.f), -0x1.26e978p-7f);
  }
}

TEST(EpilogueOrder, AccIsConvertedToFp32BeforeScaling) {
  // f32(16777217) = 16777216 (2^24 + 1 is a tie between 2^24 and 2^24 + 2; even is 2^24).
  //   sb * f32(acc) = 3 * 2^24 = 50331648 (exact).
  //   Scaling in a wider type first would give 3 * 16777217 = 50331651 -> fl 50331652.
  EXPECT_EQ(epilogue_value(Scheme::kDynamicSymmetric, 16777217, 1.f, 0, 3.f, 0, false, 0.f),
            50331648.f);
  // 2^24 + 3 is a tie between 2^24 + 2 and 2^24 + 4 (even): 16777220.
  EXPECT_EQ(epilogue_value(Scheme::kDynamicSymmetric, 16777219, 1.f, 0, 1.f, 0, false, 0.f),
            16777220.f);
  EXPECT_EQ(epilogue_value(Scheme::kDynamicSymmetric, INT32_MIN, 1.f, 0, 1.f, 0, false, 0.f),
            -2147483648.f);
}

TEST(EpilogueOrder, BiasIsAddedWithOneFma) {
  // sa = sb = 1 + 2^-12, acc = 1, bias = -(1 + 2^-11).
  //   sa * (sb * 1) exact = 1 + 2^-11 + 2^-24;
  //   fma adds the bias to the exact product: 2^-24.
  //   A separate multiply rounds the product first: 2^-24 is half an ulp at 1, a tie, to even:
  //   1 + 2^-11; adding the bias then gives 0.
  const float a = 1.f + 0x1p-12f;
  const float bias = -(1.f + 0x1p-11f);
  ASSERT_EQ(a * a + bias, 0.f);  // what mul + add would give
  for (Scheme s : {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric}) {
    EXPECT_EQ(epilogue_value(s, 1, a, 0, a, 0, true, bias), 0x1p-24f) << scheme_name(s);
  }
  // Asymmetric schemes use the same fma with t in place of acc (t = 1 here).
  EXPECT_EQ(epilogue_value(Scheme::kStaticAsymmetric, 5, a, 0, a, 4, true, bias), 0x1p-24f);
  EXPECT_EQ(epilogue_value(Scheme::kDynamicAsymmetric, 7, a, 2, a, 3, true, bias), 0x1p-24f);
}

TEST(EpilogueOrder, NoBiasMeansNoBiasTerm) {
  // has_bias = false ignores whatever is passed as the bias.
  EXPECT_EQ(epilogue_value(Scheme::kDynamicSymmetric, 10, 0.5f, 0, 0.25f, 0, false, 100.f), 1.25f);
  EXPECT_EQ(epilogue_value(Scheme::kStaticAsymmetric, 10, 0.5f, 0, 0.25f, 2, false, 100.f), 1.f);
  EXPECT_EQ(epilogue_value(Scheme::kDynamicAsymmetric, 10, 0.5f, 1, 0.25f, 2, false, 100.f), 1.f);
}

// ---------------------------------------------------------------------------------------------
// Asymmetric corrections, in int32 before the conversion to fp32.

TEST(EpilogueAsymmetric, DynamicSubtractsAzpTimesAzpAdj) {
  // t = acc - azp * azp_adj = 1000 - (-3 * 200) = 1600; sb * t = 0.25 * 1600 = 400;
  // fma(0.5, 400, 0) = 200.
  EXPECT_EQ(epilogue_value(Scheme::kDynamicAsymmetric, 1000, 0.5f, -3, 0.25f, 200, false, 0.f),
            200.f);
  // With bias 1.5: fma(0.5, 400, 1.5) = 201.5.
  EXPECT_EQ(epilogue_value(Scheme::kDynamicAsymmetric, 1000, 0.5f, -3, 0.25f, 200, true, 1.5f),
            201.5f);
  // The subtraction is in int32: 16777217 - 1 * 1 = 16777216 exactly. In fp32 it would be
  // f32(16777217) - 1 = 16777216 - 1 = 16777215.
  EXPECT_EQ(epilogue_value(Scheme::kDynamicAsymmetric, 16777217, 1.f, 1, 1.f, 1, false, 0.f),
            16777216.f);
  // azp = 0 (a constant row) leaves acc as is.
  EXPECT_EQ(epilogue_value(Scheme::kDynamicAsymmetric, 12, 2.f, 0, 0.5f, 999, false, 0.f), 12.f);
}

TEST(EpilogueAsymmetric, StaticSubtractsTheFoldedAzpAdj) {
  // t = acc - azp_adj = 110 - 100 = 10 (azp_adj already holds azp * colsum); the per-row azp
  // argument is not used again. fma(0.5, 0.25 * 10, 1) = 2.25.
  EXPECT_EQ(epilogue_value(Scheme::kStaticAsymmetric, 110, 0.5f, 10, 0.25f, 100, true, 1.f), 2.25f);
  EXPECT_EQ(epilogue_value(Scheme::kStaticAsymmetric, 110, 0.5f, -7, 0.25f, 100, true, 1.f), 2.25f);
  // In int32: 16777217 - 1 = 16777216, not f32(16777217) - 1.
  EXPECT_EQ(epilogue_value(Scheme::kStaticAsymmetric, 16777217, 1.f, 0, 1.f, 1, false, 0.f),
            16777216.f);
}

// ---------------------------------------------------------------------------------------------
// The whole epilogue over a layer: bias rounding to the output dtype, output conversion.

// A one-channel layer whose epilogue inputs are given directly.
LayerWeights one_channel(Scheme scheme, float sb, std::vector<float> bias, int32_t azp_adj = 0) {
  LayerWeights w;
  w.config.n = 1;
  w.config.k = 1;
  w.config.scheme = scheme;
  w.config.has_bias = !bias.empty();
  w.sb = {sb};
  w.bias = std::move(bias);
  if (is_asymmetric(scheme)) w.azp_adj = {azp_adj};
  return w;
}

uint16_t epilogue16(const LayerWeights& w, int32_t acc, float sa, DType t, int32_t azp = 0) {
  uint16_t y = 0xdead;
  reference::epilogue(w, &acc, &sa, &azp, 1, &y, t);
  return y;
}

float epilogue32(const LayerWeights& w, int32_t acc, float sa, int32_t azp = 0) {
  float y = -1.f;
  reference::epilogue(w, &acc, &sa, &azp, 1, &y, DType::kF32);
  return y;
}

TEST(EpilogueBias, RoundedToBf16OutputBeforeTheFma) {
  // bias = 1 + 2^-8 is a bf16 tie between 1.0 (even) and 1 + 2^-7: bias_f = 1.0.
  // sa * (sb * acc) = 2^-9 * (1 * 1) = 2^-9.
  //   fma(2^-9, 1, 1.0) = 1 + 2^-9 -> bf16: a quarter ulp above 1.0 -> 0x3f80 (1.0).
  //   With the unrounded bias: 1 + 2^-8 + 2^-9 = three quarters of an ulp -> 0x3f81.
  const LayerWeights w = one_channel(Scheme::kDynamicSymmetric, 1.f, {1.f + 0x1p-8f});
  EXPECT_EQ(epilogue16(w, 1, 0x1p-9f, DType::kBF16), 0x3f80);
}

TEST(EpilogueBias, RoundedToFp16OutputBeforeTheFma) {
  // bias = 1 + 2^-11 is an fp16 tie between 1.0 (even) and 1 + 2^-10: bias_f = 1.0.
  //   fma(2^-12, 1, 1.0) = 1 + 2^-12 -> fp16 0x3c00.
  //   With the unrounded bias: 1 + 2^-11 + 2^-12 -> 0x3c01.
  const LayerWeights w = one_channel(Scheme::kDynamicSymmetric, 1.f, {1.f + 0x1p-11f});
  EXPECT_EQ(epilogue16(w, 1, 0x1p-12f, DType::kF16), 0x3c00);
}

TEST(EpilogueBias, KeptInFp32ForFp32Output) {
  // fp32 output uses the fp32 bias: 1 + 2^-11 + 2^-12 = 1 + 3 * 2^-12 (exact).
  const LayerWeights w = one_channel(Scheme::kDynamicSymmetric, 1.f, {1.f + 0x1p-11f});
  EXPECT_EQ(epilogue32(w, 1, 0x1p-12f), 1.f + 3 * 0x1p-12f);
  // The same for every scheme (t = 1 for the asymmetric ones: acc 3 - azp_adj 2; acc 3 - 1 * 2).
  EXPECT_EQ(
      epilogue32(one_channel(Scheme::kStaticAsymmetric, 1.f, {1.f + 0x1p-11f}, 2), 3, 0x1p-12f),
      1.f + 3 * 0x1p-12f);
  EXPECT_EQ(
      epilogue32(one_channel(Scheme::kDynamicAsymmetric, 1.f, {1.f + 0x1p-11f}, 2), 3, 0x1p-12f, 1),
      1.f + 3 * 0x1p-12f);
}

TEST(EpilogueBias, AsymmetricSchemesRoundTheBiasToo) {
  // As RoundedToBf16OutputBeforeTheFma with t = acc - azp_adj = 1 (static) and
  // t = acc - azp * azp_adj = 5 - 2 * 2 = 1 (dynamic).
  EXPECT_EQ(epilogue16(one_channel(Scheme::kStaticAsymmetric, 1.f, {1.f + 0x1p-8f}, 4), 5, 0x1p-9f,
                       DType::kBF16),
            0x3f80);
  EXPECT_EQ(epilogue16(one_channel(Scheme::kDynamicAsymmetric, 1.f, {1.f + 0x1p-8f}, 2), 5, 0x1p-9f,
                       DType::kBF16, 2),
            0x3f80);
}

TEST(EpilogueOutput, OneRoundToNearestEvenConversion) {
  // sa * (sb * acc) = 1 * (1 * 16777217) -> f32 16777216 -> bf16 0x4b80 (2^24, exact);
  // fp16: 2^24 > 65504 -> Inf.
  const LayerWeights w = one_channel(Scheme::kDynamicSymmetric, 1.f, {});
  EXPECT_EQ(epilogue16(w, 16777217, 1.f, DType::kBF16), 0x4b80);
  // sb = 2^-8: 257 * 2^-8 = 1 + 2^-8, a bf16 tie -> 0x3f80 (even);
  // 259 * 2^-8 = 1 + 3 * 2^-8, a tie -> 0x3f82 (even).
  const LayerWeights w8 = one_channel(Scheme::kDynamicSymmetric, 0x1p-8f, {});
  EXPECT_EQ(epilogue16(w8, 257, 1.f, DType::kBF16), 0x3f80);
  EXPECT_EQ(epilogue16(w8, 259, 1.f, DType::kBF16), 0x3f82);
  // fp16 ties: 2049 -> 2048, 2051 -> 2052.
  EXPECT_EQ(epilogue16(w, 2049, 1.f, DType::kF16), 0x6800);  // 2048
  EXPECT_EQ(epilogue16(w, 2051, 1.f, DType::kF16), 0x6802);  // 2052
}

TEST(EpilogueOutput, Fp16OverflowGivesSignedInfinity) {
  const LayerWeights w = one_channel(Scheme::kDynamicSymmetric, 1.f, {});
  EXPECT_EQ(epilogue16(w, 65504, 1.f, DType::kF16), 0x7bff);
  EXPECT_EQ(epilogue16(w, 65519, 1.f, DType::kF16), 0x7bff);  // below the midpoint 65520
  EXPECT_EQ(epilogue16(w, 65520, 1.f, DType::kF16), 0x7c00);  // the midpoint ties to Inf
  EXPECT_EQ(epilogue16(w, -65520, 1.f, DType::kF16), 0xfc00);
  EXPECT_EQ(epilogue16(w, 100000, 1.f, DType::kF16), 0x7c00);
  EXPECT_EQ(epilogue16(w, -100000, 1.f, DType::kF16), 0xfc00);
  // The same values are finite in bf16: 65520 -> 0x4780 (65536).
  EXPECT_EQ(epilogue16(w, 65520, 1.f, DType::kBF16), 0x4780);
  // Huge scales overflow fp32 itself: 1e30 * (1e30 * 1) = Inf.
  const LayerWeights big = one_channel(Scheme::kDynamicSymmetric, 1e30f, {});
  EXPECT_EQ(epilogue32(big, 1, 1e30f), kInf);
  EXPECT_EQ(epilogue32(big, -1, 1e30f), -kInf);
}

TEST(EpilogueOutput, RowsAndColumnsUseTheirOwnScales) {
  // 2 x 3 output: y[m][n] = sa[m] * (sb[n] * acc[m][n]) + bias[n].
  LayerWeights w;
  w.config.n = 3;
  w.config.k = 1;
  w.config.scheme = Scheme::kDynamicAsymmetric;
  w.config.has_bias = true;
  w.sb = {1.f, 2.f, 4.f};
  w.bias = {0.f, 100.f, 1000.f};
  w.azp_adj = {1, 10, 100};
  const int32_t acc[6] = {1, 2, 3, 4, 5, 6};
  const float sa[2] = {0.5f, 0.25f};
  const int32_t azp[2] = {0, -1};
  float y[6];
  reference::epilogue(w, acc, sa, azp, 2, y, DType::kF32);
  // Row 0 (azp 0): t = acc.      0.5 * (1*1) + 0 = 0.5;  0.5 * (2*2) + 100 = 102;
  //                              0.5 * (4*3) + 1000 = 1006.
  // Row 1 (azp -1): t = acc + adj. 0.25 * (1*5) = 1.25;  0.25 * (2*15) + 100 = 107.5;
  //                              0.25 * (4*106) + 1000 = 1106.
  const float want[6] = {0.5f, 102.f, 1006.f, 1.25f, 107.5f, 1106.f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], want[i]) << "i=" << i;
}

// ---------------------------------------------------------------------------------------------
// azp_adj at load, and the asymmetric schemes end to end.

std::vector<int8_t> three_rows() {
  // Column sums (sum over k of each output row n): 10, -2, 508.
  return {1, 2, 3, 4, -128, 127, -1, 0, 127, 127, 127, 127};
}

LayerSpec spec_for(Scheme scheme) {
  LayerSpec spec;
  spec.n = 3;
  spec.k = 4;
  spec.scheme = scheme;
  spec.weight_scale = {0.25f, 0.125f, 1.f};
  if (is_static(scheme)) {
    spec.has_input_scale = true;
    spec.input_scale = 0.5f;
  }
  if (scheme == Scheme::kStaticAsymmetric) {
    spec.has_input_zero_point = true;
    spec.input_zero_point = -5;
  }
  return spec;
}

TEST(AzpAdj, StaticAsymmetricFoldsTheZeroPoint) {
  auto lw = build_layer_weights(spec_for(Scheme::kStaticAsymmetric), three_rows());
  ASSERT_TRUE(lw.ok()) << lw.status();
  // -5 * {10, -2, 508}.
  EXPECT_EQ((*lw)->azp_adj, (std::vector<int32_t>{-50, 10, -2540}));
  EXPECT_EQ((*lw)->config.input_zero_point, -5);
  EXPECT_EQ((*lw)->config.input_scale, 0.5f);
}

TEST(AzpAdj, DynamicAsymmetricKeepsColumnSums) {
  auto lw = build_layer_weights(spec_for(Scheme::kDynamicAsymmetric), three_rows());
  ASSERT_TRUE(lw.ok()) << lw.status();
  EXPECT_EQ((*lw)->azp_adj, (std::vector<int32_t>{10, -2, 508}));
}

TEST(AzpAdj, SymmetricSchemesHaveNone) {
  for (Scheme s : {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric}) {
    auto lw = build_layer_weights(spec_for(s), three_rows());
    ASSERT_TRUE(lw.ok()) << lw.status();
    EXPECT_TRUE((*lw)->azp_adj.empty()) << scheme_name(s);
  }
}

RunArgs f32_args(const std::vector<float>& x, int64_t m, float* y, float* sa, int32_t* azp) {
  RunArgs a;
  a.x = x.data();
  a.x_dtype = DType::kF32;
  a.m = m;
  a.y = y;
  a.y_dtype = DType::kF32;
  a.sa = sa;
  a.azp = azp;
  return a;
}

TEST(AsymmetricEndToEnd, StaticZeroPointCancels) {
  // s = 0.5 (inv 2), azp = -5, x = {1, -1, 2.25, 0}:
  //   x * 2 = {2, -2, 4.5, 0} -> rne {2, -2, 4, 0} -> + azp -> xq = {-3, -7, -1, -5}.
  // sum_k (xq - azp) * W[n] = sum_k {2, -2, 4, 0} * W[n]:
  //   n=0: 2 - 4 + 12 + 0 = 10;  n=1: -256 - 254 - 4 + 0 = -514;  n=2: 127 * 4 = 508.
  // y = sa * (sb * t): 0.5 * 0.25 * 10 = 1.25;  0.5 * 0.125 * -514 = -32.125;  0.5 * 508 = 254.
  auto lw = build_layer_weights(spec_for(Scheme::kStaticAsymmetric), three_rows());
  ASSERT_TRUE(lw.ok()) << lw.status();
  float y[3], sa[1];
  int32_t azp[1];
  ASSERT_TRUE(reference::w8a8_linear(**lw, f32_args({1.f, -1.f, 2.25f, 0.f}, 1, y, sa, azp)).ok());
  EXPECT_EQ(sa[0], 0.5f);
  EXPECT_EQ(azp[0], -5);
  EXPECT_EQ(y[0], 1.25f);
  EXPECT_EQ(y[1], -32.125f);
  EXPECT_EQ(y[2], 254.f);
}

TEST(AsymmetricEndToEnd, DynamicZeroPointCancels) {
  // x = {0, 255, 2.5, 3.5}: s = 1, azp = -128, xq = {-128, 127, -126, -124}.
  // t[n] = acc[n] - azp * colsum[n] = sum_k (xq - azp) * W[n] = sum_k {0, 255, 2, 4} * W[n]:
  //   n=0: 510 + 6 + 16 = 532;  n=1: 32385 - 2 + 0 = 32383;  n=2: 127 * 261 = 33147.
  // y = 1 * (sb * t): 0.25 * 532 = 133;  0.125 * 32383 = 4047.875;  33147.
  auto lw = build_layer_weights(spec_for(Scheme::kDynamicAsymmetric), three_rows());
  ASSERT_TRUE(lw.ok()) << lw.status();
  float y[3], sa[1];
  int32_t azp[1];
  ASSERT_TRUE(reference::w8a8_linear(**lw, f32_args({0.f, 255.f, 2.5f, 3.5f}, 1, y, sa, azp)).ok());
  EXPECT_EQ(sa[0], 1.f);
  EXPECT_EQ(azp[0], -128);
  EXPECT_EQ(y[0], 133.f);
  EXPECT_EQ(y[1], 4047.875f);
  EXPECT_EQ(y[2], 33147.f);
}

}  // namespace
}  // namespace qlinear
