#include "kernels/cuda/cuda_kernels.h"

#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/registry.h"

namespace qlinear {

void register_cuda_kernels(Registry* registry) { (void)registry->add(gpu::make_cublaslt_kernel()); }

}  // namespace qlinear
