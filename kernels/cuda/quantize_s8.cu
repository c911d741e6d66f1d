// cuda.quantize: see quantize_s8.h. Every fp32 operation that the reference performs is written
// here with an explicit round-to-nearest intrinsic (__fmul_rn, __fdiv_rn, __fsub_rn), so that
// neither FMA contraction nor approximate division can change a bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/quantize_s8.h"

namespace qlinear::gpu {
namespace {

constexpr int kMaxWarps = 32;

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

// Loads 4 consecutive elements starting at p (aligned to 4 elements) as fp32.
template <typename T>
__device__ __forceinline__ void load4(const T* p, float v[4]) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);  // 8 bytes: four 16-bit values
  v[0] = bits16_to_f32<T>(u.x & 0xffffu);
  v[1] = bits16_to_f32<T>(u.x >> 16);
  v[2] = bits16_to_f32<T>(u.y & 0xffffu);
  v[3] = bits16_to_f32<T>(u.y >> 16);
}
template <>
__device__ __forceinline__ void load4<float>(const float* p, float v[4]) {
  const float4 u = *reinterpret_cast<const float4*>(p);
  v[0] = u.x;
  v[1] = u.y;
  v[2] = u.z;
  v[3] = u.w;
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

// What pass 2 does with a row, decided once by thread 0.
enum RowMode : int { kQuantize = 0, kZeroRow = 1, kBadRow = 2 };

template <QuantScheme S>
__device__ __forceinline__ int8_t quantize_value(float v, float mul, float divisor, int32_t zp) {
  if constexpr (S == QuantScheme::kDynamicSymmetric) {
    return sat8(sat32(__fmul_rn(v, mul)));  // multiply by 127/absmax
  } else if constexpr (S == QuantScheme::kStaticSymmetric) {
    return sat8(sat32(__fdiv_rn(v, divisor)));  // a true division
  } else {
    return sat8(wrap_add(sat32(__fmul_rn(v, mul)), zp));
  }
}

template <typename T, QuantScheme S, bool kVec>
__global__ void __launch_bounds__(1024)
    quantize_rows_s8(const T* __restrict__ x, int64_t k, QuantizeParams p, int8_t* __restrict__ xq,
                     float* __restrict__ sa, int32_t* __restrict__ azp) {
  constexpr bool kAbsmax = S == QuantScheme::kDynamicSymmetric;
  constexpr bool kMinMax = S == QuantScheme::kDynamicAsymmetric;
  const int64_t row = blockIdx.x;
  const T* xr = x + row * k;
  int8_t* qr = xq + row * k;

  // Pass 1: the row's reduction; the finiteness check rides on it.
  float absmax = 0.f, mn = INFINITY, mx = -INFINITY;
  bool bad = false;
  auto visit = [&](float v) {
    bad |= !(fabsf(v) <= FLT_MAX);
    if constexpr (kAbsmax) absmax = fmaxf(absmax, fabsf(v));
    if constexpr (kMinMax) {
      mn = fminf(mn, v);
      mx = fmaxf(mx, v);
    }
  };
  if constexpr (kVec) {
    for (int64_t i = 4 * static_cast<int64_t>(threadIdx.x); i < k; i += 4 * blockDim.x) {
      float v[4];
      load4(xr + i, v);
#pragma unroll
      for (int j = 0; j < 4; ++j) visit(v[j]);
    }
  } else {
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) visit(to_f32(xr[i]));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    if constexpr (kAbsmax) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, off));
    if constexpr (kMinMax) {
      mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, off));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    }
  }
  bad = __any_sync(0xffffffffu, bad);

  __shared__ float s_absmax[kMaxWarps], s_mn[kMaxWarps], s_mx[kMaxWarps];
  __shared__ int s_bad[kMaxWarps];
  __shared__ float s_mul, s_div;
  __shared__ int32_t s_zp;
  __shared__ int s_mode;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_absmax[warp] = absmax;
    s_mn[warp] = mn;
    s_mx[warp] = mx;
    s_bad[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int warps = blockDim.x / 32;
    for (int w = 1; w < warps; ++w) {
      absmax = fmaxf(absmax, s_absmax[w]);
      mn = fminf(mn, s_mn[w]);
      mx = fmaxf(mx, s_mx[w]);
      bad = bad || s_bad[w];
    }
    int mode = kQuantize;
    float mul = 0.f, div = 1.f;
    int32_t zp = 0;
    if (bad) {
      mode = kBadRow;
      sa[row] = __int_as_float(0x7fffffff);  // NaN: the row's flag (a real sa is never NaN)
    } else if constexpr (S == QuantScheme::kDynamicSymmetric) {
      sa[row] = __fdiv_rn(absmax, 127.f);
      mul = absmax == 0.f ? 0.f : __fdiv_rn(127.f, absmax);
    } else if constexpr (S == QuantScheme::kStaticSymmetric) {
      sa[row] = p.input_scale;
      div = p.input_scale;
    } else if constexpr (S == QuantScheme::kDynamicAsymmetric) {
      const float s = __fdiv_rn(__fsub_rn(mx, mn), 255.f);
      sa[row] = s;
      if (s == 0.f) {
        mode = kZeroRow;  // constant row: xq = 0, azp = 0, output = bias
      } else {
        zp = sat32(__fsub_rn(-128.f, __fdiv_rn(mn, s)));
        mul = __fdiv_rn(1.f, s);
      }
    } else {
      sa[row] = p.input_scale;
      zp = p.input_zero_point;
      mul = __fdiv_rn(1.f, p.input_scale);
    }
    if (azp != nullptr && mode != kBadRow) azp[row] = zp;
    s_mode = mode;
    s_mul = mul;
    s_div = div;
    s_zp = zp;
  }
  __syncthreads();
  const int mode = s_mode;
  if (mode == kBadRow) return;
  const float mul = s_mul, div = s_div;
  const int32_t zp = s_zp;

  // Pass 2: quantize (the row is in L1/L2 from pass 1).
  if constexpr (kVec) {
    for (int64_t i = 4 * static_cast<int64_t>(threadIdx.x); i < k; i += 4 * blockDim.x) {
      uint32_t packed = 0;
      if (mode == kQuantize) {
        float v[4];
        load4(xr + i, v);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint8_t q = static_cast<uint8_t>(quantize_value<S>(v[j], mul, div, zp));
          packed |= static_cast<uint32_t>(q) << (8 * j);
        }
      }
      *reinterpret_cast<uint32_t*>(qr + i) = packed;
    }
  } else {
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
      qr[i] = mode == kQuantize ? quantize_value<S>(to_f32(xr[i]), mul, div, zp) : int8_t{0};
    }
  }
}

template <typename T, QuantScheme S>
cudaError_t launch_typed(const void* x, int64_t m, int64_t k, const QuantizeParams& p, int8_t* xq,
                         float* sa, int32_t* azp, cudaStream_t stream) {
  // Enough threads that each handles a few 4-element chunks; a block per row keeps the row's
  // reduction in one block (no second launch, no atomics).
  int threads = 32;
  while (threads < 512 && threads * 16 < k) threads *= 2;
  const bool vec = k % 4 == 0 && reinterpret_cast<uintptr_t>(x) % (4 * sizeof(T)) == 0 &&
                   reinterpret_cast<uintptr_t>(xq) % 4 == 0;
  const T* xt = static_cast<const T*>(x);
  const dim3 grid(static_cast<unsigned>(m));
  if (vec) {
    quantize_rows_s8<T, S, true><<<grid, threads, 0, stream>>>(xt, k, p, xq, sa, azp);
  } else {
    quantize_rows_s8<T, S, false><<<grid, threads, 0, stream>>>(xt, k, p, xq, sa, azp);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_for_type(const void* x, int64_t m, int64_t k, const QuantizeParams& p,
                            int8_t* xq, float* sa, int32_t* azp, cudaStream_t stream) {
  switch (p.scheme) {
    case QuantScheme::kDynamicSymmetric:
      return launch_typed<T, QuantScheme::kDynamicSymmetric>(x, m, k, p, xq, sa, azp, stream);
    case QuantScheme::kStaticSymmetric:
      return launch_typed<T, QuantScheme::kStaticSymmetric>(x, m, k, p, xq, sa, azp, stream);
    case QuantScheme::kDynamicAsymmetric:
      return launch_typed<T, QuantScheme::kDynamicAsymmetric>(x, m, k, p, xq, sa, azp, stream);
    case QuantScheme::kStaticAsymmetric:
      return launch_typed<T, QuantScheme::kStaticAsymmetric>(x, m, k, p, xq, sa, azp, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_quantize_s8(const void* x, ElemType x_type, int64_t m, int64_t k,
                               const QuantizeParams& params, int8_t* xq, float* sa, int32_t* azp,
                               cudaStream_t stream) {
  if (m < 1 || m > 0x7fffffff || k < 1) return cudaErrorInvalidValue;
  switch (x_type) {
    case ElemType::kF32:
      return launch_for_type<float>(x, m, k, params, xq, sa, azp, stream);
    case ElemType::kF16:
      return launch_for_type<__half>(x, m, k, params, xq, sa, azp, stream);
    case ElemType::kBF16:
      return launch_for_type<__nv_bfloat16>(x, m, k, params, xq, sa, azp, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace qlinear::gpu
