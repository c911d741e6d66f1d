// Device-side pieces of SPEC section 2 shared by every CUDA kernel that quantizes activations
// (cuda.quantize's own kernel and the fused kernels that quantize inside their GEMM launch), so
// that each of them rounds exactly as the reference does. Every fp32 operation is an explicit
// round-to-nearest intrinsic: no FMA contraction or approximate division can change a bit.
//
// CUDA only (included by .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/quantize_rne.h"
#include "kernels/cuda/quantize_s8.h"

namespace qlinear::gpu::device {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

// Widens 16-bit storage to fp32 exactly.
template <typename T>
__device__ __forceinline__ float bits16_to_f32(uint32_t b);
template <>
__device__ __forceinline__ float bits16_to_f32<__half>(uint32_t b) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}
template <>
__device__ __forceinline__ float bits16_to_f32<__nv_bfloat16>(uint32_t b) {
  return __uint_as_float(b << 16);
}

// reference::sat32: rne then clamp to int32, NaN -> 0. cvt.rni.s32.f32 clamps by itself; the NaN
// guard makes the NaN case explicit rather than a property of the conversion instruction.
__device__ __forceinline__ int32_t sat32(float v) { return v != v ? 0 : __float2int_rn(v); }
__device__ __forceinline__ int8_t sat8(int32_t v) {
  return static_cast<int8_t>(v < -128 ? -128 : (v > 127 ? 127 : v));
}
// int32 addition that wraps (reference::wrap_add).
__device__ __forceinline__ int32_t wrap_add(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}

// What the second pass over a row does.
enum RowMode : int { kQuantize = 0, kZeroRow = 1, kBadRow = 2 };

// One value of a row whose parameters are known, before its saturation to int8. `mul` is
// 127/absmax (dynamic symmetric) or 1/s (asymmetric), `divisor` the static scale, `zp` the zero
// point.
template <QuantScheme S>
__device__ __forceinline__ int32_t quantize_value_s32(float v, float mul, float divisor,
                                                      int32_t zp) {
  if constexpr (S == QuantScheme::kDynamicSymmetric) {
    return sat32(__fmul_rn(v, mul));  // multiply by 127/absmax
  } else if constexpr (S == QuantScheme::kStaticSymmetric) {
    return sat32(__fdiv_rn(v, divisor));  // a true division
  } else {
    return wrap_add(sat32(__fmul_rn(v, mul)), zp);
  }
}
// The same, saturated to int8: the quantized value.
template <QuantScheme S>
__device__ __forceinline__ int8_t quantize_value(float v, float mul, float divisor, int32_t zp) {
  return sat8(quantize_value_s32<S>(v, mul, divisor, zp));
}

// The row statistics pass 1 gathers; `bad` rides on the same loads (NaN or +-Inf seen).
struct RowStats {
  float absmax = 0.f;
  float mn = INFINITY;
  float mx = -INFINITY;
  bool bad = false;
  __device__ __forceinline__ void visit(float v) {
    bad |= !(fabsf(v) <= FLT_MAX);
    absmax = fmaxf(absmax, fabsf(v));
    mn = fminf(mn, v);
    mx = fmaxf(mx, v);
  }
  // max/min are exact and order-free, so partial statistics merge in any order.
  __device__ __forceinline__ void merge(const RowStats& o) {
    absmax = fmaxf(absmax, o.absmax);
    mn = fminf(mn, o.mn);
    mx = fmaxf(mx, o.mx);
    bad = bad || o.bad;
  }
};

// The statistics of a row that a full warp's lanes gathered parts of, in every lane.
__device__ __forceinline__ RowStats warp_reduce(RowStats st) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    st.absmax = fmaxf(st.absmax, __shfl_xor_sync(0xffffffffu, st.absmax, off));
    st.mn = fminf(st.mn, __shfl_xor_sync(0xffffffffu, st.mn, off));
    st.mx = fmaxf(st.mx, __shfl_xor_sync(0xffffffffu, st.mx, off));
  }
  st.bad = __any_sync(0xffffffffu, st.bad);
  return st;
}

// A row's quantization parameters, from its complete statistics: sa (NaN for a bad row, the flag
// the host scans for), azp, and what pass 2 needs.
struct RowParams {
  float sa = 0.f;
  float mul = 0.f;
  float div = 1.f;
  int32_t zp = 0;
  int mode = kQuantize;
};

template <QuantScheme S>
__device__ __forceinline__ RowParams row_params(const RowStats& st, const QuantizeParams& p) {
  RowParams r;
  if (st.bad) {
    r.mode = kBadRow;
    r.sa = __int_as_float(0x7fffffff);  // NaN: the row's flag (a real sa is never NaN)
  } else if constexpr (S == QuantScheme::kDynamicSymmetric) {
    r.sa = __fdiv_rn(st.absmax, 127.f);
    r.mul = st.absmax == 0.f ? 0.f : __fdiv_rn(127.f, st.absmax);
  } else if constexpr (S == QuantScheme::kStaticSymmetric) {
    r.sa = p.input_scale;
    r.div = p.input_scale;
  } else if constexpr (S == QuantScheme::kDynamicAsymmetric) {
    const float s = __fdiv_rn(__fsub_rn(st.mx, st.mn), 255.f);
    r.sa = s;
    if (s == 0.f) {
      r.mode = kZeroRow;  // constant row: xq = 0, azp = 0, output = bias
    } else {
      r.zp = sat32(__fsub_rn(-128.f, __fdiv_rn(st.mn, s)));
      r.mul = __fdiv_rn(1.f, s);
    }
  } else {
    r.sa = p.input_scale;
    r.zp = p.input_zero_point;
    r.mul = __fdiv_rn(1.f, p.input_scale);
  }
  return r;
}

// row_params with the scheme chosen at run time (one uniform branch).
__device__ __forceinline__ RowParams row_params(QuantScheme s, const RowStats& st,
                                                const QuantizeParams& p) {
  switch (s) {
    case QuantScheme::kDynamicSymmetric:
      return row_params<QuantScheme::kDynamicSymmetric>(st, p);
    case QuantScheme::kStaticSymmetric:
      return row_params<QuantScheme::kStaticSymmetric>(st, p);
    case QuantScheme::kDynamicAsymmetric:
      return row_params<QuantScheme::kDynamicAsymmetric>(st, p);
    case QuantScheme::kStaticAsymmetric:
    default:
      return row_params<QuantScheme::kStaticAsymmetric>(st, p);
  }
}

// quantize_value with the scheme chosen at run time; a row that is not kQuantize gives 0.
__device__ __forceinline__ int8_t quantize_value(QuantScheme s, float v, const RowParams& r) {
  if (r.mode != kQuantize) return 0;
  switch (s) {
    case QuantScheme::kDynamicSymmetric:
      return quantize_value<QuantScheme::kDynamicSymmetric>(v, r.mul, r.div, r.zp);
    case QuantScheme::kStaticSymmetric:
      return quantize_value<QuantScheme::kStaticSymmetric>(v, r.mul, r.div, r.zp);
    default:  // both asymmetric schemes
      return quantize_value<QuantScheme::kDynamicAsymmetric>(v, r.mul, r.div, r.zp);
  }
}

// --- Rows of 16-bit values, 8 at a time (one 16-byte vector), for the kernels that quantize a
// --- row per warp (quantize_rows_warp_s8 and the quantizing GEMM tiles' auxiliary warp).
//
// For bf16 and fp16, |v| orders as the unsigned integer (bits & 0x7fff), and a magnitude at or
// above kNonFinite16 is an Inf or a NaN. So the statistics of every scheme but dynamic asymmetric
// (which needs the signed minimum and maximum) are one packed unsigned max per two values; the
// largest magnitude's bits widened to fp32 are exactly the absmax that fmaxf over |v| finds.

template <typename T>
inline constexpr uint32_t kNonFinite16 = 0x7f80u;  // bf16: exponent all ones
template <>
inline constexpr uint32_t kNonFinite16<__half> = 0x7c00u;

// Eight 16-bit values (one 16-byte load) widened to fp32, exactly.
template <typename T>
__device__ __forceinline__ void widen8(const uint4& u, float (&v)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = bits16_to_f32<T>(w[j] & 0xffffu);
    v[2 * j + 1] = bits16_to_f32<T>(w[j] >> 16);
  }
}

// A warp's partial statistics of a row: the packed magnitude maximum, or (dynamic asymmetric)
// RowStats.
template <typename T, QuantScheme S>
struct WarpRowStats {
  static constexpr bool kMinMax = S == QuantScheme::kDynamicAsymmetric;
  uint32_t mag = 0;
  RowStats st;
  __device__ __forceinline__ void visit8(const uint4& u) {
    if constexpr (kMinMax) {
      float v[8];
      widen8<T>(u, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) st.visit(v[j]);
    } else {
      mag = __vmaxu2(mag, u.x & 0x7fff7fffu);
      mag = __vmaxu2(mag, u.y & 0x7fff7fffu);
      mag = __vmaxu2(mag, u.z & 0x7fff7fffu);
      mag = __vmaxu2(mag, u.w & 0x7fff7fffu);
    }
  }
  // The whole row's statistics, in every lane of the (full) warp.
  __device__ __forceinline__ RowStats reduce() {
    if constexpr (kMinMax) {
      return warp_reduce(st);
    } else {
      const uint32_t m = __reduce_max_sync(0xffffffffu, max(mag >> 16, mag & 0xffffu));
      RowStats r;
      r.bad = m >= kNonFinite16<T>;
      r.absmax = bits16_to_f32<T>(m);
      return r;
    }
  }
};

// Four int32 values saturated to int8 and packed, the first in the lowest byte.
__device__ __forceinline__ uint32_t pack4_sat_s8(int32_t q0, int32_t q1, int32_t q2, int32_t q3) {
  uint32_t hi, r;
  asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, 0;" : "=r"(hi) : "r"(q3), "r"(q2));
  asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(q1), "r"(q0), "r"(hi));
  return r;
}

// Eight values of a row whose parameters are known (mode kQuantize), quantized and packed: the
// same values as quantize_value<S> for each (the packing's saturation is its sat8).
//
// Dynamic symmetric with a finite multiplier (every row but those whose absmax is so small that
// 127 / absmax overflows) takes no conversion instruction (quantize_rne.h): |v| <= absmax, so
// |v * mul| <= 127 * (1 + 2^-24)^2 rounds to at most 127 and needs no saturation, and the low
// byte of rne_bits is what sat32 then sat8 give.
//
// Built with QLINEAR_QUANTIZE_RNE=0 (CMAKE_CUDA_FLAGS), every row takes the conversion instead: the
// form before the add, kept for measuring the add against it (qlinear_gpu_bench --setup_quant and
// --prefill, one binary of each build).
#ifndef QLINEAR_QUANTIZE_RNE
#define QLINEAR_QUANTIZE_RNE 1
#endif
template <typename T, QuantScheme S>
__device__ __forceinline__ uint2 quantize8(const uint4& u, const RowParams& rp) {
  float v[8];
  widen8<T>(u, v);
  if constexpr (QLINEAR_QUANTIZE_RNE && S == QuantScheme::kDynamicSymmetric) {
    if (rp.mul <= FLT_MAX) {
      uint32_t b[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) b[j] = rne_bits(__fmul_rn(v[j], rp.mul));
      return make_uint2(low_bytes4(b[0], b[1], b[2], b[3]), low_bytes4(b[4], b[5], b[6], b[7]));
    }
  }
  int32_t q[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) q[j] = quantize_value_s32<S>(v[j], rp.mul, rp.div, rp.zp);
  return make_uint2(pack4_sat_s8(q[0], q[1], q[2], q[3]), pack4_sat_s8(q[4], q[5], q[6], q[7]));
}

}  // namespace qlinear::gpu::device
