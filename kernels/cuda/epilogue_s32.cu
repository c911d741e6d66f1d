// The SPEC section 4 epilogue; see epilogue_s32.h. The arithmetic of one element lives in
// epilogue_s32_device.cuh (explicit round-to-nearest intrinsics), shared with the fused kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/epilogue_s32.h"
#include "kernels/cuda/epilogue_s32_device.cuh"

namespace qlinear::gpu {
namespace {

using device::dequant;
using device::round_to_y;
using device::to_bits16;
using device::ZeroPoint;

// Each thread owns kW consecutive columns and walks rows blockIdx.y, blockIdx.y + gridDim.y, ...,
// so the per-column values (sb, bias, azp_adj) are loaded once per thread.
template <ElemType Y, ZeroPoint Z, bool kBias, int kW>
__global__ void __launch_bounds__(128) epilogue_s32_kernel(EpilogueArgs a) {
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kW;
  if (col0 >= a.n) return;
  float sb[kW], bias_f[kW];
  int32_t adj[kW];
#pragma unroll
  for (int j = 0; j < kW; ++j) {
    sb[j] = a.sb[col0 + j];
    bias_f[j] = kBias ? round_to_y<Y>(a.bias[col0 + j]) : 0.f;
    adj[j] = Z == ZeroPoint::kNone ? 0 : a.azp_adj[col0 + j];
  }
  for (int64_t row = blockIdx.y; row < a.m; row += gridDim.y) {
    const float sa = a.sa[row];
    const int32_t azp = Z == ZeroPoint::kDynamic ? a.azp[row] : 0;
    const int64_t base = row * a.n + col0;
    int32_t acc[kW];
    if constexpr (kW == 4) {
      const int4 v = *reinterpret_cast<const int4*>(a.acc + base);
      acc[0] = v.x;
      acc[1] = v.y;
      acc[2] = v.z;
      acc[3] = v.w;
    } else {
      acc[0] = a.acc[base];
    }
    float out[kW];
#pragma unroll
    for (int j = 0; j < kW; ++j)
      out[j] = dequant<Z, kBias>(acc[j], sa, azp, sb[j], adj[j], bias_f[j]);
    if constexpr (Y == ElemType::kF32) {
      float* y = static_cast<float*>(a.y) + base;
      if constexpr (kW == 4) {
        *reinterpret_cast<float4*>(y) = make_float4(out[0], out[1], out[2], out[3]);
      } else {
        y[0] = out[0];
      }
    } else {
      uint16_t* y = static_cast<uint16_t*>(a.y) + base;
      if constexpr (kW == 4) {
        *reinterpret_cast<uint2*>(y) =
            make_uint2(to_bits16<Y>(out[0]) | (to_bits16<Y>(out[1]) << 16),
                       to_bits16<Y>(out[2]) | (to_bits16<Y>(out[3]) << 16));
      } else {
        y[0] = static_cast<uint16_t>(to_bits16<Y>(out[0]));
      }
    }
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <ElemType Y, ZeroPoint Z, bool kBias>
cudaError_t launch_typed(const EpilogueArgs& a, cudaStream_t stream) {
  constexpr int kThreads = 128;
  const bool vec = a.n % 4 == 0 && aligned(a.acc, 16) && aligned(a.y, 16) && aligned(a.sb, 16) &&
                   (a.bias == nullptr || aligned(a.bias, 16)) &&
                   (a.azp_adj == nullptr || aligned(a.azp_adj, 16));
  const int w = vec ? 4 : 1;
  const int64_t col_blocks = (a.n + int64_t{kThreads} * w - 1) / (int64_t{kThreads} * w);
  if (col_blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(col_blocks),
                  static_cast<unsigned>(std::min<int64_t>(a.m, 65535)));
  if (vec) {
    epilogue_s32_kernel<Y, Z, kBias, 4><<<grid, kThreads, 0, stream>>>(a);
  } else {
    epilogue_s32_kernel<Y, Z, kBias, 1><<<grid, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <ElemType Y>
cudaError_t launch_for_y(const EpilogueArgs& a, cudaStream_t stream) {
  const bool bias = a.bias != nullptr;
  switch (a.scheme) {
    case QuantScheme::kDynamicSymmetric:
    case QuantScheme::kStaticSymmetric:
      return bias ? launch_typed<Y, ZeroPoint::kNone, true>(a, stream)
                  : launch_typed<Y, ZeroPoint::kNone, false>(a, stream);
    case QuantScheme::kStaticAsymmetric:
      return bias ? launch_typed<Y, ZeroPoint::kStatic, true>(a, stream)
                  : launch_typed<Y, ZeroPoint::kStatic, false>(a, stream);
    case QuantScheme::kDynamicAsymmetric:
      return bias ? launch_typed<Y, ZeroPoint::kDynamic, true>(a, stream)
                  : launch_typed<Y, ZeroPoint::kDynamic, false>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_epilogue_s32(const EpilogueArgs& args, cudaStream_t stream) {
  if (args.m < 1 || args.n < 1) return cudaErrorInvalidValue;
  const bool asym = args.scheme == QuantScheme::kDynamicAsymmetric ||
                    args.scheme == QuantScheme::kStaticAsymmetric;
  if (asym && args.azp_adj == nullptr) return cudaErrorInvalidValue;
  if (args.scheme == QuantScheme::kDynamicAsymmetric && args.azp == nullptr) {
    return cudaErrorInvalidValue;
  }
  switch (args.y_type) {
    case ElemType::kF32:
      return launch_for_y<ElemType::kF32>(args, stream);
    case ElemType::kF16:
      return launch_for_y<ElemType::kF16>(args, stream);
    case ElemType::kBF16:
      return launch_for_y<ElemType::kBF16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace qlinear::gpu
