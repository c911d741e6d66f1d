#include "kernels/cpu/cpu_kernels.h"

#include "kernels/core/status.h"
#include "kernels/cpu/amx_kernel.h"
#include "kernels/cpu/avx2_kernel.h"
#include "kernels/cpu/avx512_vnni_kernel.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/registry.h"

namespace qlinear {

absl::Status register_cpu_kernels(Registry* registry) {
  // Each is registered whether or not it is compiled in or supported here, so that the kernel
  // listing shows each with its reason; kernel_priority_order() decides their order.
  RETURN_IF_ERROR(registry->add(cpu::make_amx_kernel()));
  RETURN_IF_ERROR(registry->add(cpu::make_avx512_vnni_kernel()));
  RETURN_IF_ERROR(registry->add(cpu::make_onednn_kernel()));
  return registry->add(cpu::make_avx2_kernel());
}

}  // namespace qlinear
