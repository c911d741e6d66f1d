#include "kernels/reference/reference_w8a8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/steady_clock.h"

namespace qlinear::reference {
namespace {

// int32 arithmetic that wraps as the GPU's does (vLLM computes these in int32) instead of being
// undefined behaviour; only extreme rows or zero points ever reach the wrap.
int32_t wrap_mul(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
}
int32_t wrap_add(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}
int32_t wrap_sub(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) - static_cast<uint32_t>(b));
}

}  // namespace

float rne(float v) { return std::nearbyint(v); }

int32_t sat32(float v) {
  if (std::isnan(v)) return 0;
  const float r = rne(v);
  if (r >= 2147483648.f) return INT32_MAX;  // 2^31, the first float above INT32_MAX
  if (r < -2147483648.f) return INT32_MIN;
  return static_cast<int32_t>(r);
}

int8_t sat8(int32_t v) { return static_cast<int8_t>(std::clamp(v, -128, 127)); }

bool quantize_row(const LayerConfig& config, const float* x, int64_t k, int8_t* xq, float* sa,
                  int32_t* azp) {
  for (int64_t i = 0; i < k; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  switch (config.scheme) {
    case Scheme::kDynamicSymmetric: {
      float absmax = 0.f;
      for (int64_t i = 0; i < k; ++i) absmax = std::max(absmax, std::fabs(x[i]));
      *sa = absmax / 127.f;
      // Multiply by 127/absmax (not 1/sa, not divide by sa): vLLM's exact operation.
      const float inv = absmax == 0.f ? 0.f : 127.f / absmax;
      for (int64_t i = 0; i < k; ++i) xq[i] = sat8(sat32(x[i] * inv));
      return true;
    }
    case Scheme::kStaticSymmetric: {
      const float s = config.input_scale;
      *sa = s;
      for (int64_t i = 0; i < k; ++i) xq[i] = sat8(sat32(x[i] / s));  // a true division
      return true;
    }
    case Scheme::kDynamicAsymmetric: {
      float mn = x[0], mx = x[0];
      for (int64_t i = 1; i < k; ++i) {
        mn = std::min(mn, x[i]);
        mx = std::max(mx, x[i]);
      }
      const float s = (mx - mn) / 255.f;
      *sa = s;
      if (s == 0.f) {
        // Constant row (or a range that underflows): the output is the bias. xq = 0 and azp = 0
        // make acc = 0 and t = 0, with no division by zero.
        *azp = 0;
        std::fill(xq, xq + k, int8_t{0});
        return true;
      }
      const int32_t zp = sat32(-128.f - mn / s);
      *azp = zp;
      const float inv = 1.f / s;
      for (int64_t i = 0; i < k; ++i) {
        xq[i] = sat8(wrap_add(sat32(x[i] * inv), zp));
      }
      return true;
    }
    case Scheme::kStaticAsymmetric: {
      const float s = config.input_scale;
      const int32_t zp = config.input_zero_point;
      *sa = s;
      *azp = zp;
      const float inv = 1.f / s;
      for (int64_t i = 0; i < k; ++i) {
        xq[i] = sat8(wrap_add(sat32(x[i] * inv), zp));
      }
      return true;
    }
  }
  return false;
}

absl::Status quantize_activations(const LayerConfig& config, const void* x, DType x_dtype,
                                  int64_t m, int8_t* xq, float* sa, int32_t* azp) {
  const int64_t k = config.k;
  std::vector<float> row(k);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) row[i] = load_as_f32(x, x_dtype, r * k + i);
    int32_t zp = 0;
    if (!quantize_row(config, row.data(), k, xq + r * k, &sa[r], &zp)) {
      int64_t col = 0;
      while (col < k && std::isfinite(row[col])) ++col;
      return absl::InvalidArgumentError(absl::StrCat("x row ", r, " holds a non-finite value (",
                                                     row[col], " at column ", col, ")"));
    }
    if (azp != nullptr) azp[r] = zp;
  }
  return absl::OkStatus();
}

void gemm_s8s8_s32(const int8_t* xq, const int8_t* w, int64_t m, int64_t n, int64_t k,
                   int32_t* acc) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      int32_t s = 0;
      for (int64_t i = 0; i < k; ++i) s += int32_t{xq[r * k + i]} * int32_t{w[c * k + i]};
      acc[r * n + c] = s;
    }
  }
}

float epilogue_value(Scheme scheme, int32_t acc, float sa_m, int32_t azp_m, float sb_n,
                     int32_t azp_adj_n, bool has_bias, float bias_f_n) {
  switch (scheme) {
    case Scheme::kDynamicSymmetric:
    case Scheme::kStaticSymmetric: {
      const float scaled = sb_n * static_cast<float>(acc);
      return has_bias ? std::fma(sa_m, scaled, bias_f_n) : sa_m * scaled;
    }
    case Scheme::kStaticAsymmetric: {
      // azp_adj already holds input_zero_point * colsum.
      const float t = static_cast<float>(wrap_sub(acc, azp_adj_n));
      return std::fma(sa_m, sb_n * t, has_bias ? bias_f_n : 0.f);
    }
    case Scheme::kDynamicAsymmetric: {
      const float t = static_cast<float>(wrap_sub(acc, wrap_mul(azp_m, azp_adj_n)));
      return std::fma(sa_m, sb_n * t, has_bias ? bias_f_n : 0.f);
    }
  }
  return 0.f;
}

void epilogue(const LayerWeights& weights, const int32_t* acc, const float* sa, const int32_t* azp,
              int64_t m, void* y, DType y_dtype) {
  const LayerConfig& c = weights.config;
  const bool asym = is_asymmetric(c.scheme);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < c.n; ++j) {
      // vLLM holds the bias in the activation dtype: round it to the output dtype first.
      const float bias_f = c.has_bias ? round_to_dtype(weights.bias[j], y_dtype) : 0.f;
      const float v =
          epilogue_value(c.scheme, acc[r * c.n + j], sa[r], asym ? azp[r] : 0, weights.sb[j],
                         asym ? weights.azp_adj[j] : 0, c.has_bias, bias_f);
      store_from_f32(y, y_dtype, r * c.n + j, v);
    }
  }
}

absl::Status w8a8_linear(const LayerWeights& weights, const RunArgs& args, RunTimings* timings) {
  const LayerConfig& c = weights.config;
  const int64_t m = args.m;
  std::vector<int8_t> xq(m * c.k);
  std::vector<float> sa(m);
  std::vector<int32_t> azp(m);
  std::vector<int32_t> acc(m * c.n);
  const int64_t t0 = steady_now_ns();
  if (absl::Status s =
          quantize_activations(c, args.x, args.x_dtype, m, xq.data(), sa.data(), azp.data());
      !s.ok()) {
    return s;
  }
  const int64_t t1 = steady_now_ns();
  gemm_s8s8_s32(xq.data(), weights.w.data(), m, c.n, c.k, acc.data());
  epilogue(weights, acc.data(), sa.data(), azp.data(), m, args.y, args.y_dtype);
  const int64_t t2 = steady_now_ns();
  if (args.sa != nullptr) std::copy(sa.begin(), sa.end(), args.sa);
  if (args.azp != nullptr && is_asymmetric(c.scheme)) std::copy(azp.begin(), azp.end(), args.azp);
  if (timings != nullptr) {
    timings->quantize_ns = t1 - t0;
    timings->gemm_ns = t2 - t1;
  }
  return absl::OkStatus();
}

namespace {

class ReferencePrepared final : public PreparedKernel {
 public:
  explicit ReferencePrepared(const LayerWeights& w) : weights_(w) {}
  absl::Status run(const RunArgs& args, RunTimings* timings) const override {
    return w8a8_linear(weights_, args, timings);
  }

 private:
  const LayerWeights& weights_;
};

class ReferenceKernel final : public Kernel {
 public:
  absl::string_view name() const override { return "cpu.reference"; }
  absl::Status is_supported(const HostInfo&) const override { return absl::OkStatus(); }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    if (config.k > kMaxK) {
      return absl::InvalidArgumentError(absl::StrCat("K=", config.k, " exceeds ", kMaxK));
    }
    if (shape.m < 1) return absl::InvalidArgumentError("M must be >= 1");
    return absl::OkStatus();  // every scheme, dtype and shape
  }
  bool measurable() const override { return false; }  // the priority order ranks it
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
    return std::unique_ptr<PreparedKernel>(new ReferencePrepared(weights));
  }
};

}  // namespace

std::unique_ptr<Kernel> make_reference_kernel() { return std::make_unique<ReferenceKernel>(); }

}  // namespace qlinear::reference
