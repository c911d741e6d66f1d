#include <cstdint>

#include "bench/gpu/copy_kernel.h"

namespace qlinear::gpu {
namespace {

__global__ void __launch_bounds__(512)
    copy_16b(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Four independent loads in flight per thread before the stores.
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

}  // namespace

cudaError_t launch_copy_16b(const void* src, void* dst, size_t bytes, int sm_count,
                            cudaStream_t stream) {
  if (bytes % 16 != 0) return cudaErrorInvalidValue;
  copy_16b<<<sm_count * 4, 512, 0, stream>>>(static_cast<const uint4*>(src),
                                             static_cast<uint4*>(dst), bytes / 16);
  return cudaGetLastError();
}

}  // namespace qlinear::gpu
