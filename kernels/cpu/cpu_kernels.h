// The optimized CPU kernel families, registered into the registry by register_builtin_kernels.
#pragma once

namespace qlinear {

class Registry;

// Registers every CPU kernel compiled into this binary (each checks the host at run time).
void register_cpu_kernels(Registry* registry);

}  // namespace qlinear
