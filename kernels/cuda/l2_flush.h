// A read-only pass over a device buffer larger than the L2, so that the next kernel finds its
// operands in device memory (HBM) as a request in serving does, not in the cache. Reading rather
// than writing (cudaMemset) leaves no dirty lines to be written back during the timed call.
//
// Compiled by nvcc and by the host compiler: plain C++ only (see quantize_s8.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace qlinear::gpu {

// Enqueues a kernel on `stream` that reads `bytes` bytes of `buffer` (16-byte aligned; a tail
// below 16 bytes is not read). `sink` (4 bytes of device memory) is written only in the unlikely
// case that the bytes' XOR equals a fixed value, which keeps the compiler from dropping the reads.
// Returns the launch error, if any.
cudaError_t launch_l2_flush_read(const void* buffer, size_t bytes, uint32_t* sink,
                                 cudaStream_t stream);

// Enqueues one thread that holds `stream` for `ns` nanoseconds of the GPU's global timer, so that
// the host can queue the calls behind it meanwhile and they then run back to back, not at the
// rate the host launches them. Returns the launch error, if any.
cudaError_t launch_stream_hold(uint64_t ns, cudaStream_t stream);

}  // namespace qlinear::gpu
