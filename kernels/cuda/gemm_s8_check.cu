#include "kernels/cuda/gemm_s8_check.h"

namespace qlinear::gpu {
namespace {

__global__ void gemm_s8s8_s32_check(const int8_t* __restrict__ xq, const int8_t* __restrict__ w,
                                    int64_t m, int64_t n, int64_t k, int32_t* __restrict__ acc) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = blockIdx.y;
  if (col >= n || row >= m) return;
  const int8_t* a = xq + row * k;
  const int8_t* b = w + col * k;
  int32_t s = 0;
  for (int64_t i = 0; i < k; ++i) s += int32_t{a[i]} * int32_t{b[i]};
  acc[row * n + col] = s;
}

}  // namespace

cudaError_t launch_gemm_s8s8_s32_check(const int8_t* xq, const int8_t* w, int64_t m, int64_t n,
                                       int64_t k, int32_t* acc, cudaStream_t stream) {
  if (m < 1 || n < 1 || k < 1 || m > 65535 * 1024) return cudaErrorInvalidValue;
  for (int64_t r0 = 0; r0 < m; r0 += 65535) {
    const int64_t rows = m - r0 < 65535 ? m - r0 : 65535;
    const dim3 grid(static_cast<unsigned>((n + 127) / 128), static_cast<unsigned>(rows));
    gemm_s8s8_s32_check<<<grid, 128, 0, stream>>>(xq + r0 * k, w, rows, n, k, acc + r0 * n);
  }
  return cudaGetLastError();
}

}  // namespace qlinear::gpu
