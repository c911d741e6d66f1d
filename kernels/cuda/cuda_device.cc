// detect_cuda_devices() for builds with CUDA (kernels/core/no_cuda.cc is the stub otherwise).
// Compiled into qlinear_kernels_core; it needs only the CUDA runtime, never a kernel.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/core/host_info.h"

namespace qlinear {

void detect_cuda_devices(HostInfo* info) {
  info->cuda_compiled = true;
  info->gpus.clear();
  int count = 0;
  // Without a driver or a device this returns an error (cudaErrorNoDevice,
  // cudaErrorInsufficientDriver, ...); it never aborts.
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    info->cuda_error = absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    return;
  }
  if (count == 0) {
    info->cuda_error = "the CUDA runtime reports 0 devices";
    return;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    const cudaError_t pe = cudaGetDeviceProperties(&p, i);
    if (pe != cudaSuccess) {
      cudaGetLastError();
      info->cuda_error = absl::StrCat("cudaGetDeviceProperties(", i, "): ", cudaGetErrorName(pe),
                                      ": ", cudaGetErrorString(pe));
      continue;
    }
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
    g.sm_count = p.multiProcessorCount;
    info->gpus.push_back(std::move(g));
  }
}

}  // namespace qlinear
