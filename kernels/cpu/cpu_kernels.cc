#include "kernels/cpu/cpu_kernels.h"

#include "kernels/cpu/avx2_kernel.h"
#include "kernels/cpu/avx512_vnni_kernel.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/registry.h"

namespace qlinear {

void register_cpu_kernels(Registry* registry) {
  // Both are registered whether or not they are compiled in or supported here, so that the kernel
  // listing shows each with its reason; kernel_priority_order() decides their order.
  (void)registry->add(cpu::make_avx512_vnni_kernel());
  (void)registry->add(cpu::make_onednn_kernel());
  (void)registry->add(cpu::make_avx2_kernel());
}

}  // namespace qlinear
