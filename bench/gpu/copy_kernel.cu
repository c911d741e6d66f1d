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

// Reads every byte once (8 independent 16-byte loads in flight per thread) and writes one word
// per thread, so that the compiler keeps the loads.
__global__ void __launch_bounds__(512)
    read_16b(const uint4* __restrict__ src, size_t n, uint32_t* __restrict__ sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __ldcs(src + i + j * stride);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = src[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  sink[static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x] = acc;
}

__global__ void empty_kernel() {}

}  // namespace

cudaError_t launch_empty(cudaStream_t stream) {
  empty_kernel<<<1, 32, 0, stream>>>();
  return cudaGetLastError();
}

cudaError_t launch_read_16b(const void* src, size_t bytes, int sm_count, void* sink,
                            cudaStream_t stream) {
  if (bytes % 16 != 0) return cudaErrorInvalidValue;
  read_16b<<<sm_count * 4, 512, 0, stream>>>(static_cast<const uint4*>(src), bytes / 16,
                                             static_cast<uint32_t*>(sink));
  return cudaGetLastError();
}

cudaError_t launch_copy_16b(const void* src, void* dst, size_t bytes, int sm_count,
                            cudaStream_t stream) {
  if (bytes % 16 != 0) return cudaErrorInvalidValue;
  copy_16b<<<sm_count * 4, 512, 0, stream>>>(static_cast<const uint4*>(src),
                                             static_cast<uint4*>(dst), bytes / 16);
  return cudaGetLastError();
}

}  // namespace qlinear::gpu
