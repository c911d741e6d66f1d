// cpu.reference: the oracle. Scalar, exact, and written to be read next to SPEC sections 2-4;
// every other kernel is tested bit-exact against these functions. Do not optimize this file.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "kernels/core/kernel.h"
#include "kernels/core/layer.h"

namespace qlinear::reference {

// Round half to even under the default rounding mode (never std::round).
float rne(float v);
// rne, then clamp to int32; NaN gives 0 (the result of CUDA's cvt.rni.sat.s32.f32).
int32_t sat32(float v);
// Clamp to [-128, 127].
int8_t sat8(int32_t v);

// Quantizes one row of K fp32 values (SPEC section 2). For static schemes `sa`/`azp` are read
// from `config`; for dynamic ones they are computed. Writes xq[K], *sa and, for asymmetric
// schemes, *azp. Returns false (and writes nothing meaningful) if the row holds NaN or +-Inf.
bool quantize_row(const LayerConfig& config, const float* x, int64_t k, int8_t* xq, float* sa,
                  int32_t* azp);

// Quantizes x [M, K] of type x_dtype into xq [M, K], sa [M] and (asymmetric) azp [M].
// INVALID_ARGUMENT names the first row that holds a non-finite value.
absl::Status quantize_activations(const LayerConfig& config, const void* x, DType x_dtype,
                                  int64_t m, int8_t* xq, float* sa, int32_t* azp);

// acc[m, n] = sum_k xq[m, k] * w[n, k], exact int32.
void gemm_s8s8_s32(const int8_t* xq, const int8_t* w, int64_t m, int64_t n, int64_t k,
                   int32_t* acc);

// The epilogue of SPEC section 4 for one element; the operation order is the contract.
// `azp_m` is ignored by symmetric schemes; `azp_adj_n` by them too.
float epilogue_value(Scheme scheme, int32_t acc, float sa_m, int32_t azp_m, float sb_n,
                     int32_t azp_adj_n, bool has_bias, float bias_f_n);

// y [M, N] in y_dtype from acc [M, N], sa [M], azp [M] and the layer's sb, bias and azp_adj.
void epilogue(const LayerWeights& weights, const int32_t* acc, const float* sa, const int32_t* azp,
              int64_t m, void* y, DType y_dtype);

// The whole W8A8 op: quantize, GEMM, epilogue. sa/azp may be null.
absl::Status w8a8_linear(const LayerWeights& weights, const RunArgs& args,
                         RunTimings* timings = nullptr);

std::unique_ptr<Kernel> make_reference_kernel();

}  // namespace qlinear::reference
