// A copy between device memory and mapped page-locked host memory done by a kernel instead of
// the copy engine, for the serving path's small copies: in a replayed CUDA graph a copy-engine
// node costs several microseconds of latency whatever its size, a kernel node about one (see
// cuda_host_call.cc).
//
// Compiled by nvcc and by the host compiler: plain C++ only (see quantize_s8.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace qlinear::gpu {

// Enqueues a kernel on `stream` that copies `bytes` bytes from `src` to `dst`, either of which may
// be a device pointer to mapped page-locked host memory (cudaHostGetDevicePointer). Both 16-byte
// aligned, and `bytes` rounded up to a multiple of 16 must lie inside both buffers. Returns the
// launch error, if any.
cudaError_t launch_mapped_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);

}  // namespace qlinear::gpu
