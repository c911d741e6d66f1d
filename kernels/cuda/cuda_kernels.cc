#include "kernels/cuda/cuda_kernels.h"

#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cutlass_sm90_gemm.h"
#include "kernels/cuda/gemv_s8.h"
#include "kernels/cuda/stream_s8.h"
#include "kernels/registry.h"

namespace qlinear {

void register_cuda_kernels(Registry* registry) {
  // cuda.gemv_s8 prefers M = 1 and cuda.stream_s8 M = 1..16 (the H200 measurements behind those
  // ranges are beside preferred_m in gemv_s8.cc and stream_s8.cc), cuda.cutlass_sm90 every M,
  // cuda.cublaslt what none takes; autotune picks among them per layer and bucket.
  (void)registry->add(gpu::make_gemv_s8_kernel());
  (void)registry->add(gpu::make_stream_s8_kernel());
  (void)registry->add(gpu::make_cutlass_sm90_kernel());
  (void)registry->add(gpu::make_cublaslt_kernel());
}

}  // namespace qlinear
