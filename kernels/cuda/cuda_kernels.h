// The CUDA kernel families, registered into the registry by register_builtin_kernels when the
// binary is built with CUDA. Each checks the device and the compiled architectures at run time.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace qlinear {

class Registry;

// Registers every CUDA kernel compiled into this binary. An error (a name missing from
// kernel_priority_order()) is a bug in this build.
absl::Status register_cuda_kernels(Registry* registry);

// Whether `run` replays calls of up to 64 rows from CUDA graphs (gpu::CallGraphs; on by default).
// Off, every call queues its copies and kernels one by one and is timed stage by stage.
void set_cuda_graphs(bool enabled);

// Reserves `bytes` of pinned host memory and as much device memory for each of the serving
// path's stream contexts now (gpu::StreamPool::reserve_all), creating the pool. Returns the bytes
// reserved in all (0 without a usable GPU), or why the reservation failed.
absl::StatusOr<int64_t> reserve_cuda_staging(int64_t bytes);

// gpu::StreamPool::trim on the pool if it exists (nothing otherwise): the bytes released.
int64_t trim_cuda_staging(std::chrono::steady_clock::duration idle);

// What the stream contexts hold now (pinned host, device), zeros before the pool exists.
std::pair<int64_t, int64_t> cuda_staging_bytes();

}  // namespace qlinear
