// A device-to-device copy with 16-byte loads and stores from every SM: the memory-bandwidth
// ceiling the benchmark prints (a cudaMemcpy replayed in a graph may run on a copy engine,
// which is slower than the SMs).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace qlinear::gpu {

// bytes must be a multiple of 16 and both pointers 16-byte aligned.
cudaError_t launch_copy_16b(const void* src, void* dst, size_t bytes, int sm_count,
                            cudaStream_t stream);

}  // namespace qlinear::gpu
