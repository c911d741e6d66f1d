// Linked when the project is built without CUDA.
#include "kernels/core/host_info.h"

namespace qlinear {

void detect_cuda_devices(HostInfo* info) {
  info->cuda_compiled = false;
  info->cuda_error = "built without CUDA";
}

}  // namespace qlinear
