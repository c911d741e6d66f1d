#include "kernels/cuda/cuda_kernels.h"

#include "kernels/core/status.h"
#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cutlass_sm90_gemm.h"
#include "kernels/cuda/stream_s8.h"
#include "kernels/registry.h"

namespace qlinear {

absl::Status register_cuda_kernels(Registry* registry) {
  // cuda.stream_s8 prefers M = 1..16, cuda.cutlass_sm90 every M, cuda.cublaslt takes what neither
  // can; autotune picks among them per layer and bucket (the H200 measurements are beside
  // preferred_m in stream_s8.cc and cutlass_sm90_gemm.cc). cuda.gemv_s8 is built, tested and
  // benchmarked but not registered: cuda.stream_s8 was faster at M = 1 on every benchmark shape
  // (the table in stream_s8.cc), and preparing gemv_s8 would time every one of its launch plans
  // on every layer at load for a kernel autotune never keeps.
  RETURN_IF_ERROR(registry->add(gpu::make_stream_s8_kernel()));
  RETURN_IF_ERROR(registry->add(gpu::make_cutlass_sm90_kernel()));
  return registry->add(gpu::make_cublaslt_kernel());
}

}  // namespace qlinear
