#include "kernels/core/weights.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qlinear {
namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (int64_t d : shape) p *= d;
  return p;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::Status validate_layer_spec(const LayerSpec& spec) {
  if (spec.n <= 0 || spec.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n and k must be positive, got n=", spec.n, " k=", spec.k));
  }
  if (spec.k > kMaxK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k=", spec.k, " exceeds ", kMaxK, ", the largest K whose int32 accumulation is exact"));
  }
  if (spec.n > (int64_t{1} << 31) || spec.n * spec.k > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", spec.n, "x", spec.k, " is too large"));
  }
  switch (spec.scheme) {
    case Scheme::kDynamicSymmetric:
    case Scheme::kStaticSymmetric:
    case Scheme::kDynamicAsymmetric:
    case Scheme::kStaticAsymmetric:
      break;
    default:
      return absl::InvalidArgumentError("unknown quantization scheme");
  }

  // Weight scale.
  const int64_t count = static_cast<int64_t>(spec.weight_scale.size());
  if (count == 0) return absl::InvalidArgumentError("weight_scale is required");
  // A shape, where given, is [c], [c, 1] or [1, c] (SPEC section 1): its dimensions checked before
  // they are multiplied, and a 2-D one with no dimension of 1 (a block-wise scale whose count
  // happens to match) refused rather than read as per-channel.
  const std::vector<int64_t>& shape = spec.weight_scale_shape;
  for (int64_t d : shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight_scale shape ", shape_str(shape), " has a non-positive dimension"));
    }
  }
  if (shape.size() > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_scale shape ", shape_str(shape), " has more than 2 dimensions"));
  }
  if (shape.size() == 2 && shape[0] != 1 && shape[1] != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_scale shape ", shape_str(shape),
                     " is not one of [c], [c, 1] or [1, c] (c = 1 per tensor, n per channel, or "
                     "one per logical width)"));
  }
  if (!shape.empty() && product(shape) != count) {
    return absl::InvalidArgumentError(absl::StrCat("weight_scale has ", count, " values but shape ",
                                                   shape_str(shape), " says ", product(shape)));
  }
  if (!spec.logical_widths.empty()) {
    int64_t sum = 0;
    for (int64_t w : spec.logical_widths) {
      if (w <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "logical_widths ", shape_str(spec.logical_widths), " has a non-positive width"));
      }
      // Each width checked against what is left of n before it is added, so that no sum of
      // widths can overflow (and wrap round to n).
      if (w > spec.n - sum) {
        return absl::InvalidArgumentError(absl::StrCat(
            "logical_widths ", shape_str(spec.logical_widths), " sum to more than n=", spec.n));
      }
      sum += w;
    }
    if (sum != spec.n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logical_widths ", shape_str(spec.logical_widths), " sum to ", sum, ", not n=", spec.n));
    }
  }
  const int64_t partitions = static_cast<int64_t>(spec.logical_widths.size());
  const bool per_partition = partitions > 0 && count == partitions;
  if (count != 1 && count != spec.n && !per_partition) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight_scale has ", count, " values; expected 1 (per tensor), n=", spec.n,
        " (per channel)",
        partitions > 0 ? absl::StrCat(" or ", partitions, " (one per logical width)") : ""));
  }
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(spec.weight_scale[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight_scale[", i, "] is not finite (", spec.weight_scale[i], ")"));
    }
  }

  // Bias.
  if (!spec.bias.empty()) {
    if (static_cast<int64_t>(spec.bias.size()) != spec.n) {
      return absl::InvalidArgumentError(
          absl::StrCat("bias has ", spec.bias.size(), " values, expected n=", spec.n));
    }
    for (size_t i = 0; i < spec.bias.size(); ++i) {
      if (!std::isfinite(spec.bias[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("bias[", i, "] is not finite (", spec.bias[i], ")"));
      }
    }
  }

  // Input scale and zero point: required by static schemes, refused by dynamic ones so that a
  // mistaken scheme is caught at load rather than silently ignored.
  const bool needs_scale = is_static(spec.scheme);
  const bool needs_zp = spec.scheme == Scheme::kStaticAsymmetric;
  if (needs_scale && !spec.has_input_scale) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheme ", scheme_name(spec.scheme), " requires input_scale"));
  }
  if (!needs_scale && spec.has_input_scale) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_scale is given but scheme ", scheme_name(spec.scheme),
                     " computes the scale per token; use a static scheme or drop input_scale"));
  }
  if (needs_scale && !(std::isfinite(spec.input_scale) && spec.input_scale > 0.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_scale must be finite and > 0, got ", spec.input_scale));
  }
  if (needs_zp && !spec.has_input_zero_point) {
    return absl::InvalidArgumentError("scheme static_asymmetric requires input_zero_point");
  }
  if (!needs_zp && spec.has_input_zero_point) {
    return absl::InvalidArgumentError(absl::StrCat("input_zero_point is given but scheme ",
                                                   scheme_name(spec.scheme),
                                                   " does not use a static zero point"));
  }
  return absl::OkStatus();
}

LayerConfig layer_config_of(const LayerSpec& spec) {
  LayerConfig c;
  c.n = spec.n;
  c.k = spec.k;
  c.scheme = spec.scheme;
  c.has_bias = !spec.bias.empty();
  c.input_scale = is_static(spec.scheme) ? spec.input_scale : 0.f;
  c.input_zero_point = spec.scheme == Scheme::kStaticAsymmetric ? spec.input_zero_point : 0;
  return c;
}

std::vector<float> normalize_weight_scale(const LayerSpec& spec) {
  const int64_t count = static_cast<int64_t>(spec.weight_scale.size());
  std::vector<float> sb(spec.n);
  if (count == spec.n) {
    sb = spec.weight_scale;  // [N], [N,1], [1,N]: all contiguous, selected by element count
  } else if (!spec.logical_widths.empty() &&
             count == static_cast<int64_t>(spec.logical_widths.size())) {
    int64_t row = 0;
    for (int64_t p = 0; p < count; ++p) {
      for (int64_t i = 0; i < spec.logical_widths[p]; ++i) sb[row++] = spec.weight_scale[p];
    }
  } else {
    std::fill(sb.begin(), sb.end(), spec.weight_scale[0]);
  }
  return sb;
}

std::vector<int32_t> column_sums(const int8_t* w, int64_t n, int64_t k) {
  std::vector<int32_t> sums(n);
  for (int64_t r = 0; r < n; ++r) {
    int32_t s = 0;
    const int8_t* row = w + r * k;
    for (int64_t c = 0; c < k; ++c) s += row[c];
    sums[r] = s;
  }
  return sums;
}

absl::StatusOr<std::shared_ptr<const LayerWeights>> build_layer_weights(const LayerSpec& spec,
                                                                        std::vector<int8_t> w) {
  if (absl::Status s = validate_layer_spec(spec); !s.ok()) return s;
  if (static_cast<int64_t>(w.size()) != spec.n * spec.k) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights have ", w.size(), " bytes, expected n*k=", spec.n * spec.k));
  }
  auto lw = std::make_shared<LayerWeights>();
  lw->config = layer_config_of(spec);
  lw->sb = normalize_weight_scale(spec);
  lw->bias = spec.bias;
  if (is_asymmetric(spec.scheme)) {
    lw->azp_adj = column_sums(w.data(), spec.n, spec.k);
    if (spec.scheme == Scheme::kStaticAsymmetric) {
      // Fold the static zero point in. int32 arithmetic wraps as on the GPU (vLLM); done in
      // unsigned to keep it defined behaviour in C++.
      for (int32_t& a : lw->azp_adj) {
        a = static_cast<int32_t>(static_cast<uint32_t>(a) *
                                 static_cast<uint32_t>(spec.input_zero_point));
      }
    }
  }
  lw->w = std::move(w);
  return std::shared_ptr<const LayerWeights>(std::move(lw));
}

}  // namespace qlinear
