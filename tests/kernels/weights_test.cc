// Weight preparation at load (SPEC section 3): validate_layer_spec names the field that is wrong,
// normalize_weight_scale expands every accepted scale form to fp32 [N], column_sums and
// build_layer_weights produce what every kernel's prepare step reads.
#include "kernels/core/weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/core/layer.h"

namespace qlinear {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A valid per-channel dynamic symmetric spec; tests break one field at a time.
LayerSpec valid_spec(int64_t n = 4, int64_t k = 8) {
  LayerSpec s;
  s.n = n;
  s.k = k;
  s.weight_scale.assign(n, 0.5f);
  s.weight_scale_shape = {n};
  return s;
}

LayerSpec with_scheme(Scheme scheme) {
  LayerSpec s = valid_spec();
  s.scheme = scheme;
  if (is_static(scheme)) {
    s.has_input_scale = true;
    s.input_scale = 0.02f;
  }
  if (scheme == Scheme::kStaticAsymmetric) {
    s.has_input_zero_point = true;
    s.input_zero_point = -3;
  }
  return s;
}

// Expects INVALID_ARGUMENT whose message contains every one of `parts`.
void expect_invalid(const LayerSpec& spec, std::vector<std::string> parts) {
  const absl::Status s = validate_layer_spec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), absl::string_view::npos) << "missing '" << p << "' in: " << s;
  }
  // build_layer_weights runs the same validation.
  auto built = build_layer_weights(
      spec, std::vector<int8_t>(
                spec.n > 0 && spec.k > 0 && spec.n * spec.k < 1000000 ? spec.n * spec.k : 0));
  EXPECT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument) << built.status();
}

TEST(ValidateLayerSpec, AcceptsEveryScheme) {
  for (Scheme s : {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric, Scheme::kDynamicAsymmetric,
                   Scheme::kStaticAsymmetric}) {
    EXPECT_TRUE(validate_layer_spec(with_scheme(s)).ok()) << scheme_name(s);
  }
}

TEST(ValidateLayerSpec, ShapeMustBePositive) {
  LayerSpec s = valid_spec();
  s.n = 0;
  expect_invalid(s, {"n and k must be positive", "n=0"});
  s = valid_spec();
  s.n = -4;
  expect_invalid(s, {"n and k must be positive", "n=-4"});
  s = valid_spec();
  s.k = 0;
  expect_invalid(s, {"n and k must be positive", "k=0"});
  s = valid_spec();
  s.k = -1;
  expect_invalid(s, {"k=-1"});
}

TEST(ValidateLayerSpec, KLimit) {
  LayerSpec s = valid_spec(2, kMaxK);
  EXPECT_TRUE(validate_layer_spec(s).ok());
  s.k = kMaxK + 1;
  expect_invalid(s, {"k=131072", "131071"});
}

TEST(ValidateLayerSpec, TooLarge) {
  LayerSpec s = valid_spec(1, 1);
  s.n = (int64_t{1} << 31) + 1;
  s.weight_scale = {1.f};
  s.weight_scale_shape = {1};
  expect_invalid(s, {"too large"});
}

TEST(ValidateLayerSpec, WeightScaleRequired) {
  LayerSpec s = valid_spec();
  s.weight_scale.clear();
  s.weight_scale_shape.clear();
  expect_invalid(s, {"weight_scale is required"});
}

TEST(ValidateLayerSpec, WeightScaleCount) {
  LayerSpec s = valid_spec(4);
  s.weight_scale = {1.f, 2.f, 3.f};  // neither 1 nor N
  s.weight_scale_shape = {3};
  expect_invalid(s, {"weight_scale has 3 values", "n=4"});
  // With logical widths, the message offers the per-partition count too.
  s.logical_widths = {2, 2};
  expect_invalid(s, {"weight_scale has 3 values", "2 (one per logical width)"});
  // N + 1 values.
  s = valid_spec(4);
  s.weight_scale.assign(5, 1.f);
  s.weight_scale_shape = {5};
  expect_invalid(s, {"weight_scale has 5 values"});
}

TEST(ValidateLayerSpec, WeightScaleShapeMustMatchCount) {
  LayerSpec s = valid_spec(4);
  s.weight_scale_shape = {1, 3};  // 3 != 4 values
  expect_invalid(s, {"weight_scale has 4 values but shape [1, 3] says 3"});
  // Two dimensions neither of which is 1: a block-wise scale, refused even where its count is n
  // (it would be read as per-channel), and where its product overflows.
  s.weight_scale_shape = {2, 2};
  expect_invalid(s, {"weight_scale shape [2, 2] is not one of [c], [c, 1] or [1, c]"});
  s.weight_scale_shape = {2, 3};
  expect_invalid(s, {"weight_scale shape [2, 3] is not one of"});
  s.weight_scale_shape = {7, 0x6DB6DB6DB6DB6DB7};  // 7 times that wraps to 1 in 64 bits
  s.weight_scale = {1.f};
  expect_invalid(s, {"is not one of [c], [c, 1] or [1, c]"});
  s = valid_spec(4);
  s.weight_scale_shape = {4, 1, 1};
  expect_invalid(s, {"[4, 1, 1]", "more than 2 dimensions"});
  s.weight_scale_shape = {-4, -1};
  expect_invalid(s, {"[-4, -1]", "non-positive dimension"});
  s.weight_scale_shape = {1, 4};
  EXPECT_TRUE(validate_layer_spec(s).ok());
  s.weight_scale_shape = {4, 1};
  EXPECT_TRUE(validate_layer_spec(s).ok());
  s.weight_scale_shape = {};  // scalar-less form: the count decides
  EXPECT_TRUE(validate_layer_spec(s).ok());
}

TEST(ValidateLayerSpec, WeightScaleMustBeFinite) {
  for (float bad : {kNaN, kInf, -kInf}) {
    LayerSpec s = valid_spec(4);
    s.weight_scale[2] = bad;
    expect_invalid(s, {"weight_scale[2] is not finite"});
  }
  LayerSpec s = valid_spec(4);
  s.weight_scale = {kNaN};
  s.weight_scale_shape = {1};
  expect_invalid(s, {"weight_scale[0] is not finite"});
}

TEST(ValidateLayerSpec, Bias) {
  LayerSpec s = valid_spec(4);
  s.bias = {1.f, 2.f, 3.f};
  expect_invalid(s, {"bias has 3 values", "n=4"});
  s.bias = {1.f, 2.f, 3.f, 4.f, 5.f};
  expect_invalid(s, {"bias has 5 values"});
  s.bias = {1.f, 2.f, 3.f, kNaN};
  expect_invalid(s, {"bias[3] is not finite"});
  s.bias = {-kInf, 2.f, 3.f, 4.f};
  expect_invalid(s, {"bias[0] is not finite"});
  s.bias = {1.f, 2.f, 3.f, 4.f};
  EXPECT_TRUE(validate_layer_spec(s).ok());
}

TEST(ValidateLayerSpec, LogicalWidths) {
  LayerSpec s = valid_spec(8);
  s.weight_scale = {1.f, 2.f, 3.f};
  s.weight_scale_shape = {3};
  s.logical_widths = {4, 2, 1};  // sums to 7
  expect_invalid(s, {"logical_widths [4, 2, 1] sum to 7, not n=8"});
  s.logical_widths = {4, 2, 3};  // sums to 9
  expect_invalid(s, {"logical_widths [4, 2, 3] sum to more than n=8"});
  // Widths whose int64 sum would wrap round to n: each is checked against what is left of n.
  s.weight_scale = {1.f, 2.f, 3.f, 4.f, 5.f};
  s.weight_scale_shape = {5};
  s.logical_widths = {int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62, 8};
  expect_invalid(s, {"sum to more than n=8"});
  s.weight_scale = {1.f, 2.f, 3.f};
  s.weight_scale_shape = {3};
  s.logical_widths = {4, 0, 4};
  expect_invalid(s, {"logical_widths [4, 0, 4] has a non-positive width"});
  s.logical_widths = {6, -2, 4};
  expect_invalid(s, {"non-positive width"});
  s.logical_widths = {4, 2, 2};
  EXPECT_TRUE(validate_layer_spec(s).ok());
  // Per-tensor and per-channel scales stay valid alongside logical widths.
  s.weight_scale = {1.f};
  s.weight_scale_shape = {1};
  EXPECT_TRUE(validate_layer_spec(s).ok());
  s.weight_scale.assign(8, 1.f);
  s.weight_scale_shape = {8};
  EXPECT_TRUE(validate_layer_spec(s).ok());
}

TEST(ValidateLayerSpec, StaticSchemesNeedInputScale) {
  for (Scheme scheme : {Scheme::kStaticSymmetric, Scheme::kStaticAsymmetric}) {
    LayerSpec s = with_scheme(scheme);
    s.has_input_scale = false;
    expect_invalid(s, {std::string(scheme_name(scheme)), "requires input_scale"});
    for (float bad : {0.f, -0.5f, kNaN, kInf}) {
      LayerSpec t = with_scheme(scheme);
      t.input_scale = bad;
      expect_invalid(t, {"input_scale must be finite and > 0"});
    }
  }
}

TEST(ValidateLayerSpec, DynamicSchemesRefuseInputScale) {
  for (Scheme scheme : {Scheme::kDynamicSymmetric, Scheme::kDynamicAsymmetric}) {
    LayerSpec s = with_scheme(scheme);
    s.has_input_scale = true;
    s.input_scale = 0.1f;
    expect_invalid(s, {"input_scale is given", std::string(scheme_name(scheme))});
  }
}

TEST(ValidateLayerSpec, ZeroPointRules) {
  // Static asymmetric needs it.
  LayerSpec s = with_scheme(Scheme::kStaticAsymmetric);
  s.has_input_zero_point = false;
  expect_invalid(s, {"static_asymmetric requires input_zero_point"});
  // A zero point of 0 is still a zero point.
  s.has_input_zero_point = true;
  s.input_zero_point = 0;
  EXPECT_TRUE(validate_layer_spec(s).ok());
  // Every other scheme refuses one, even 0.
  for (Scheme scheme :
       {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric, Scheme::kDynamicAsymmetric}) {
    LayerSpec t = with_scheme(scheme);
    t.has_input_zero_point = true;
    t.input_zero_point = 0;
    expect_invalid(t, {"input_zero_point is given", std::string(scheme_name(scheme))});
  }
}

TEST(ValidateLayerSpec, UnknownScheme) {
  LayerSpec s = valid_spec();
  s.scheme = static_cast<Scheme>(9);
  expect_invalid(s, {"unknown quantization scheme"});
}

// ---------------------------------------------------------------------------------------------

TEST(NormalizeWeightScale, PerChannelForms) {
  const std::vector<float> v = {0.5f, -0.25f, 3.f};
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{3}, {3, 1}, {1, 3}, {}}) {
    LayerSpec s = valid_spec(3);
    s.weight_scale = v;
    s.weight_scale_shape = shape;
    ASSERT_TRUE(validate_layer_spec(s).ok());
    EXPECT_EQ(normalize_weight_scale(s), v) << "shape size " << shape.size();
  }
}

TEST(NormalizeWeightScale, PerTensorForms) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{1}, {1, 1}, {}}) {
    LayerSpec s = valid_spec(5);
    s.weight_scale = {0.125f};
    s.weight_scale_shape = shape;
    ASSERT_TRUE(validate_layer_spec(s).ok());
    EXPECT_EQ(normalize_weight_scale(s), std::vector<float>(5, 0.125f));
  }
}

TEST(NormalizeWeightScale, PerPartition) {
  // Fused q/k/v with widths 4 + 2 + 2.
  LayerSpec s = valid_spec(8);
  s.weight_scale = {0.1f, 0.2f, 0.3f};
  s.weight_scale_shape = {3};
  s.logical_widths = {4, 2, 2};
  ASSERT_TRUE(validate_layer_spec(s).ok());
  EXPECT_EQ(normalize_weight_scale(s),
            (std::vector<float>{0.1f, 0.1f, 0.1f, 0.1f, 0.2f, 0.2f, 0.3f, 0.3f}));
  // Uneven widths 1 + 5 + 2.
  s.logical_widths = {1, 5, 2};
  EXPECT_EQ(normalize_weight_scale(s),
            (std::vector<float>{0.1f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.3f, 0.3f}));
  // One value with logical widths is per tensor.
  s.weight_scale = {0.7f};
  s.weight_scale_shape = {1};
  EXPECT_EQ(normalize_weight_scale(s), std::vector<float>(8, 0.7f));
}

TEST(NormalizeWeightScale, PerChannelWinsWhenCountIsN) {
  // N values with logical widths present: the count says per channel.
  LayerSpec s = valid_spec(4);
  s.weight_scale = {1.f, 2.f, 3.f, 4.f};
  s.logical_widths = {2, 2};
  ASSERT_TRUE(validate_layer_spec(s).ok());
  EXPECT_EQ(normalize_weight_scale(s), (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
}

// ---------------------------------------------------------------------------------------------

TEST(ColumnSums, SumsEachOutputRowOfTheNativeLayout) {
  // W [N=3, K=4] row-major: the sum runs over k within row n.
  const std::vector<int8_t> w = {1, 2, 3, 4, -128, -128, -128, -128, 127, -1, 0, 5};
  EXPECT_EQ(column_sums(w.data(), 3, 4), (std::vector<int32_t>{10, -512, 131}));
  // As [N=4, K=3] the same bytes give other sums (a transposed reading would be caught).
  EXPECT_EQ(column_sums(w.data(), 4, 3), (std::vector<int32_t>{6, -252, -129, 4}));
}

TEST(ColumnSums, ExtremesAtTheLargestK) {
  std::vector<int8_t> w(2 * kMaxK, int8_t{-128});
  std::fill(w.begin() + kMaxK, w.end(), int8_t{127});
  EXPECT_EQ(column_sums(w.data(), 2, kMaxK),
            (std::vector<int32_t>{-128 * int32_t{kMaxK}, 127 * int32_t{kMaxK}}));
}

TEST(BuildLayerWeights, FillsTheLayer) {
  LayerSpec s = with_scheme(Scheme::kStaticAsymmetric);  // n=4, k=8, input 0.02, zp -3
  s.bias = {1.f, 2.f, 3.f, 4.f};
  s.weight_scale = {0.5f, 0.25f};
  s.weight_scale_shape = {2};
  s.logical_widths = {3, 1};
  std::vector<int8_t> w(4 * 8);
  for (int i = 0; i < 32; ++i) w[i] = static_cast<int8_t>(i - 16);
  auto lw = build_layer_weights(s, w);
  ASSERT_TRUE(lw.ok()) << lw.status();
  const LayerWeights& l = **lw;
  EXPECT_EQ(l.config.n, 4);
  EXPECT_EQ(l.config.k, 8);
  EXPECT_EQ(l.config.scheme, Scheme::kStaticAsymmetric);
  EXPECT_TRUE(l.config.has_bias);
  EXPECT_EQ(l.config.input_scale, 0.02f);
  EXPECT_EQ(l.config.input_zero_point, -3);
  EXPECT_EQ(l.w, w);
  EXPECT_EQ(l.sb, (std::vector<float>{0.5f, 0.5f, 0.5f, 0.25f}));
  EXPECT_EQ(l.bias, s.bias);
  // Row n holds 8n-16 .. 8n-9: sums -100, -36, 28, 92; times zp -3.
  EXPECT_EQ(l.azp_adj, (std::vector<int32_t>{300, 108, -84, -276}));
}

TEST(BuildLayerWeights, DynamicSchemesCarryNoStaticScale) {
  auto lw = build_layer_weights(valid_spec(2, 3), std::vector<int8_t>(6, 1));
  ASSERT_TRUE(lw.ok()) << lw.status();
  EXPECT_EQ((*lw)->config.input_scale, 0.f);
  EXPECT_EQ((*lw)->config.input_zero_point, 0);
  EXPECT_FALSE((*lw)->config.has_bias);
  EXPECT_TRUE((*lw)->bias.empty());
  EXPECT_TRUE((*lw)->azp_adj.empty());
}

TEST(BuildLayerWeights, WeightByteCountMustBeNTimesK) {
  auto lw = build_layer_weights(valid_spec(4, 8), std::vector<int8_t>(31));
  EXPECT_EQ(lw.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(lw.status().message().find("weights have 31 bytes, expected n*k=32"),
            absl::string_view::npos)
      << lw.status();
  lw = build_layer_weights(valid_spec(4, 8), std::vector<int8_t>(33));
  EXPECT_EQ(lw.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace qlinear
