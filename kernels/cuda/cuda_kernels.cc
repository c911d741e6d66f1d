#include "kernels/cuda/cuda_kernels.h"

#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cutlass_sm90_gemm.h"
#include "kernels/cuda/gemv_s8.h"
#include "kernels/cuda/stream_s8.h"
#include "kernels/registry.h"

namespace qlinear {

void register_cuda_kernels(Registry* registry) {
  // cuda.gemv_s8 serves M = 1 (its preferred_m; the H200 measurements behind that choice are
  // beside it in kernels/cuda/gemv_s8.cc), cuda.cutlass_sm90 every other M, cuda.cublaslt what
  // neither takes.
  (void)registry->add(gpu::make_gemv_s8_kernel());
  (void)registry->add(gpu::make_stream_s8_kernel());
  (void)registry->add(gpu::make_cutlass_sm90_kernel());
  (void)registry->add(gpu::make_cublaslt_kernel());
}

}  // namespace qlinear
