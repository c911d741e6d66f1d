// The serving path shared by the CUDA kernels (cuda.gemv_s8, cuda.cutlass_sm90, cuda.cublaslt):
// one call on host buffers, run on a pooled stream context.
//
//   x: host -> pinned -> device in chunks (the host memcpy of one chunk overlaps the DMA of the
//   previous one); the kernel family's device half; sa/azp back first, then y in chunks, each
//   copied out of pinned memory as soon as its event fires; one stream synchronisation at the end.
//   A non-finite row (sa = NaN from the GPU) becomes INVALID_ARGUMENT with the reference's exact
//   message and leaves y untouched.
//
// No allocation once the context's buffers have grown to the largest request seen; no descriptor
// creation here (each family keeps its handles with the layer).
//
// Host compiler only (Abseil).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "kernels/core/layer.h"
#include "kernels/cuda/cuda_context.h"

namespace qlinear::gpu {

// Device buffers a debug call wants filled besides y, sa and azp: xq [m, k] and acc [m, n]
// (row-major). Null when the call is not a debug call.
struct DeviceDebugOutputs {
  int8_t* xq = nullptr;
  int32_t* acc = nullptr;
};

// The device half of one call: enqueue quantization, GEMM and epilogue on `stream` with device
// pointers (scratch: `scratch_bytes` as passed to run_on_host_buffers, 256-byte aligned), and
// fill `debug` when it is not null. Must not synchronise.
using DeviceEnqueue =
    absl::FunctionRef<absl::Status(const DeviceRunArgs& args, void* scratch, cudaStream_t stream,
                                   const StageEvents* events, const DeviceDebugOutputs* debug)>;

// Runs one call of a layer with config `c` on host buffers (see the top of this file). timings:
// quantize_ns from event 0 to 1, gemm_ns from 1 to 2 (a fused kernel records 0 and 1 together).
// debug: every intermediate, for the differential tests.
absl::Status run_on_host_buffers(StreamPool* pool, const LayerConfig& c, const RunArgs& args,
                                 size_t scratch_bytes, DeviceEnqueue enqueue, RunTimings* timings,
                                 DebugOutputs* debug);

}  // namespace qlinear::gpu
