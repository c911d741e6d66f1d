// Weight preparation at load (SPEC section 3): validation of what a client supplies, scale
// normalization to fp32 [N], and the asymmetric-scheme column sums. Runs once per layer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/layer.h"

namespace qlinear {

// A layer as a client describes it, before validation.
struct LayerSpec {
  int64_t n = 0;
  int64_t k = 0;
  Scheme scheme = Scheme::kDynamicSymmetric;
  // Weight scale values and the shape they came with: [N], [N,1], [1,N], [1], [] (scalar), or one
  // value per entry of `logical_widths` (fused modules such as q/k/v).
  std::vector<float> weight_scale;
  std::vector<int64_t> weight_scale_shape;
  std::vector<int64_t> logical_widths;  // partition widths summing to N; may be empty
  std::vector<float> bias;              // [N] widened to fp32, or empty
  bool has_input_scale = false;
  float input_scale = 0.f;
  bool has_input_zero_point = false;
  int32_t input_zero_point = 0;
};

// Checks everything but the weight bytes; INVALID_ARGUMENT says which field is wrong and why.
absl::Status validate_layer_spec(const LayerSpec& spec);

// The layer configuration a valid spec describes (what build_layer_weights puts in
// LayerWeights::config), for the checks that come before the weights (a forced kernel's).
LayerConfig layer_config_of(const LayerSpec& spec);

// Expands the weight scale to contiguous fp32 [N] (spec must be valid).
std::vector<float> normalize_weight_scale(const LayerSpec& spec);

// sum_k W[n, k] for every row n, in int32 (exact: |sum| <= 128 * K < 2^31).
std::vector<int32_t> column_sums(const int8_t* w, int64_t n, int64_t k);

// Validates `spec`, takes ownership of `w` ([N, K] int8) and builds the layer's shared data.
absl::StatusOr<std::shared_ptr<const LayerWeights>> build_layer_weights(const LayerSpec& spec,
                                                                        std::vector<int8_t> w);

}  // namespace qlinear
