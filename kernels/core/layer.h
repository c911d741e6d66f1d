// What a kernel sees of a layer and of a request: plain data, no transport types.
//
// Layout contract (SPEC sections 1-3):
//   W      int8  [N, K] row-major, the native checkpoint layout, never transposed here.
//   sb     fp32  [N] per output channel (scalar forms are expanded at load).
//   bias   fp32  [N] or empty; the epilogue rounds it to the output dtype.
//   azp_adj int32 [N], asymmetric schemes only: colsum[n] = sum_k W[n,k] (dynamic), or
//          input_zero_point * colsum[n] (static, zero point folded in).
//   x      [M, K] row-major in x_dtype; y [M, N] row-major in y_dtype.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/core/dtype.h"

namespace qlinear {

// Input quantization scheme (SPEC section 2).
enum class Scheme : int {
  kDynamicSymmetric = 1,   // sa[m] from each row; the default
  kStaticSymmetric = 2,    // layer supplies input_scale
  kDynamicAsymmetric = 3,  // sa[m], azp[m] from each row
  kStaticAsymmetric = 4,   // layer supplies input_scale and input_zero_point
};

absl::string_view scheme_name(Scheme s);
inline bool is_asymmetric(Scheme s) {
  return s == Scheme::kDynamicAsymmetric || s == Scheme::kStaticAsymmetric;
}
inline bool is_static(Scheme s) {
  return s == Scheme::kStaticSymmetric || s == Scheme::kStaticAsymmetric;
}

// Largest K for which an int32 accumulator of int8 x int8 products cannot overflow.
inline constexpr int64_t kMaxK = 131071;

// The configuration of a loaded layer, after validation and normalization.
struct LayerConfig {
  int64_t n = 0;
  int64_t k = 0;
  Scheme scheme = Scheme::kDynamicSymmetric;
  bool has_bias = false;
  float input_scale = 0.f;       // static schemes only
  int32_t input_zero_point = 0;  // static asymmetric only
};

// The immutable prepared data of a layer, shared by every kernel prepared for it. Owned by the
// layer; kernels keep pointers into it for the layer's lifetime.
struct LayerWeights {
  LayerConfig config;
  std::vector<int8_t> w;         // [N, K]
  std::vector<float> sb;         // [N]
  std::vector<float> bias;       // [N] or empty
  std::vector<int32_t> azp_adj;  // [N] for asymmetric schemes, else empty
};

// The shape of one GEMM call.
struct ProblemShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  DType x_dtype = DType::kBF16;
  DType y_dtype = DType::kBF16;
};

// Where one kernel call reads and writes. All pointers are host memory owned by the caller.
struct RunArgs {
  const void* x = nullptr;  // [M, K] in x_dtype
  DType x_dtype = DType::kBF16;
  int64_t m = 0;
  void* y = nullptr;  // [M, N] in y_dtype
  DType y_dtype = DType::kBF16;
  float* sa = nullptr;     // [M] (dynamic) or [1] (static); may be null
  int32_t* azp = nullptr;  // [M] (dynamic asymmetric) or [1] (static asymmetric); may be null
};

// Time spent by one kernel call, split the way the response metadata reports it. A CUDA call of
// up to 64 rows replayed from a CUDA graph is timed as a whole on the host clock (from the graph's
// launch to the end of its synchronisation): gemm_ns then also holds its quantization and its
// copies to and from the GPU, and quantize_ns is 0.
struct RunTimings {
  int64_t quantize_ns = 0;
  int64_t gemm_ns = 0;  // GEMM and epilogue
  // GPU kernels: the host copies of x into and of y out of pinned (page-locked) staging memory,
  // on the host clock, in neither figure above; 0 for CPU kernels.
  int64_t copy_ns = 0;
};

}  // namespace qlinear
