#include "kernels/cuda/cuda_kernels.h"

#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cutlass_sm90_gemm.h"
#include "kernels/registry.h"

namespace qlinear {

void register_cuda_kernels(Registry* registry) {
  // cuda.gemv_s8 (kernels/cuda/gemv_s8.h) is built and tested but not registered: on the H200 it
  // is slower than cuda.cutlass_sm90 and cuda.cublaslt at every M it can run (1-64; 1.3-2x at
  // M = 1, bench/gpu/gpu_bench.cc), so it would only ever be a worse choice for its buckets.
  (void)registry->add(gpu::make_cutlass_sm90_kernel());
  (void)registry->add(gpu::make_cublaslt_kernel());
}

}  // namespace qlinear
