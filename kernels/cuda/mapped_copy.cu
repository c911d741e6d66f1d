// The mapped copy; see mapped_copy.h.
#include "kernels/cuda/mapped_copy.h"

namespace qlinear::gpu {
namespace {

constexpr int kThreads = 256;
// 16-byte vectors per thread: a few loads in flight per thread over PCIe.
constexpr int kPerThread = 4;

__global__ void __launch_bounds__(kThreads)
    mapped_copy_kernel(int4* __restrict__ dst, const int4* __restrict__ src, size_t count) {
  const size_t base = static_cast<size_t>(blockIdx.x) * kThreads * kPerThread + threadIdx.x;
  int4 v[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const size_t i = base + static_cast<size_t>(j) * kThreads;
    if (i < count) v[j] = src[i];
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const size_t i = base + static_cast<size_t>(j) * kThreads;
    if (i < count) dst[i] = v[j];
  }
}

}  // namespace

cudaError_t launch_mapped_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  const size_t count = (bytes + sizeof(int4) - 1) / sizeof(int4);
  if (count == 0) return cudaSuccess;
  const size_t per_block = static_cast<size_t>(kThreads) * kPerThread;
  const unsigned blocks = static_cast<unsigned>((count + per_block - 1) / per_block);
  mapped_copy_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<int4*>(dst),
                                                      static_cast<const int4*>(src), count);
  return cudaGetLastError();
}

}  // namespace qlinear::gpu
