// The optimized CPU kernel families, registered into the registry by register_builtin_kernels.
#pragma once

#include "absl/status/status.h"

namespace qlinear {

class Registry;

// Registers every CPU kernel compiled into this binary (each checks the host at run time). An
// error (a name missing from kernel_priority_order()) is a bug in this build.
absl::Status register_cpu_kernels(Registry* registry);

}  // namespace qlinear
