// Device-side SPEC section 4 epilogue for one accumulator, shared by the separate epilogue kernel
// (epilogue_s32.cu) and the fused kernels that apply it on their own accumulators. Each fp32
// operation is an explicit round-to-nearest intrinsic (__fmul_rn, __fmaf_rn, __int2float_rn), so
// the order of the SPEC is what runs, whatever the contraction flags.
//
// CUDA only (included by .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/quantize_s8.h"

namespace qlinear::gpu::device {

// How the zero point enters t (SPEC section 4).
enum class ZeroPoint { kNone, kStatic, kDynamic };

// The value rounded to the output type and widened back (bias_f of the SPEC).
template <ElemType Y>
__device__ __forceinline__ float round_to_y(float v) {
  if constexpr (Y == ElemType::kBF16) return __bfloat162float(__float2bfloat16_rn(v));
  if constexpr (Y == ElemType::kF16) return __half2float(__float2half_rn(v));
  return v;
}

// One round-to-nearest-even conversion to a 16-bit output type, as bits.
template <ElemType Y>
__device__ __forceinline__ uint32_t to_bits16(float v) {
  if constexpr (Y == ElemType::kBF16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  return __half_as_ushort(__float2half_rn(v));
}

// round_to_y with the output type chosen at run time (uniform branches).
__device__ __forceinline__ float round_to_y(ElemType t, float v) {
  switch (t) {
    case ElemType::kBF16:
      return round_to_y<ElemType::kBF16>(v);
    case ElemType::kF16:
      return round_to_y<ElemType::kF16>(v);
    default:
      return v;
  }
}

// Writes y[idx] = v converted to the output type chosen at run time (one rounding).
__device__ __forceinline__ void store_y(void* y, ElemType t, int64_t idx, float v) {
  switch (t) {
    case ElemType::kBF16:
      static_cast<uint16_t*>(y)[idx] = static_cast<uint16_t>(to_bits16<ElemType::kBF16>(v));
      break;
    case ElemType::kF16:
      static_cast<uint16_t*>(y)[idx] = static_cast<uint16_t>(to_bits16<ElemType::kF16>(v));
      break;
    default:
      static_cast<float*>(y)[idx] = v;
  }
}

// y before the output conversion. int32 arithmetic wraps, as in the reference (wrap_sub /
// wrap_mul).
template <ZeroPoint Z, bool kBias>
__device__ __forceinline__ float dequant(int32_t acc, float sa, int32_t azp, float sb, int32_t adj,
                                         float bias_f) {
  if constexpr (Z == ZeroPoint::kNone) {
    const float scaled = __fmul_rn(sb, __int2float_rn(acc));
    return kBias ? __fmaf_rn(sa, scaled, bias_f) : __fmul_rn(sa, scaled);
  } else {
    const uint32_t zp_term = Z == ZeroPoint::kStatic
                                 ? static_cast<uint32_t>(adj)
                                 : static_cast<uint32_t>(azp) * static_cast<uint32_t>(adj);
    const float t = __int2float_rn(static_cast<int32_t>(static_cast<uint32_t>(acc) - zp_term));
    return __fmaf_rn(sa, __fmul_rn(sb, t), kBias ? bias_f : 0.f);
  }
}

// dequant with the scheme and the bias chosen at run time (uniform branches). `adj` is azp_adj[n]
// (asymmetric schemes; ignored otherwise), `bias_f` already rounded to the output type.
__device__ __forceinline__ float dequant(QuantScheme s, bool has_bias, int32_t acc, float sa,
                                         int32_t azp, float sb, int32_t adj, float bias_f) {
  switch (s) {
    case QuantScheme::kDynamicSymmetric:
    case QuantScheme::kStaticSymmetric:
      return has_bias ? dequant<ZeroPoint::kNone, true>(acc, sa, azp, sb, adj, bias_f)
                      : dequant<ZeroPoint::kNone, false>(acc, sa, azp, sb, adj, bias_f);
    case QuantScheme::kStaticAsymmetric:
      return has_bias ? dequant<ZeroPoint::kStatic, true>(acc, sa, azp, sb, adj, bias_f)
                      : dequant<ZeroPoint::kStatic, false>(acc, sa, azp, sb, adj, bias_f);
    case QuantScheme::kDynamicAsymmetric:
    default:
      return has_bias ? dequant<ZeroPoint::kDynamic, true>(acc, sa, azp, sb, adj, bias_f)
                      : dequant<ZeroPoint::kDynamic, false>(acc, sa, azp, sb, adj, bias_f);
  }
}

}  // namespace qlinear::gpu::device
