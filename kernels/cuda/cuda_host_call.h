// The serving path shared by the CUDA kernels (cuda.gemv_s8, cuda.stream_s8, cuda.cutlass_sm90,
// cuda.cublaslt): one call on host buffers, run on a pooled stream context.
//
//   x: host -> pinned -> device in chunks (the host memcpy of one chunk overlaps the DMA of the
//   previous one); the kernel family's device half; sa/azp back first, then y in chunks, each
//   copied out of pinned memory as soon as its event fires; one stream synchronisation at the end.
//   Host copies of 512 KB or more are split among a pool of four copy threads.
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
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/core/layer.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_layer.h"
#include "kernels/cuda/quantize_s8.h"

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

// A CUDA kernel family's prepared layer, on top of its device half (`enqueue`): `run` and
// `run_debug` go through run_on_host_buffers on the process's stream pool, `run_device` enqueues
// without debug outputs. It holds the layer's weights and the layer's one device copy of them,
// shared with the layer's other CUDA kernels (device_layer.h).
class HostCallPreparedKernel : public CudaPreparedKernel {
 public:
  absl::Status run(const RunArgs& args, RunTimings* timings) const override {
    return run_host(args, timings, nullptr);
  }
  absl::Status run_debug(const RunArgs& args, DebugOutputs* debug) const override {
    return run_host(args, nullptr, debug);
  }
  absl::Status run_device(const DeviceRunArgs& args, void* scratch, cudaStream_t stream,
                          const StageEvents* events) const override {
    return enqueue(args, scratch, stream, events, nullptr);
  }
  // The shared device copy counts once, for the kernel that uploaded it.
  int64_t extra_bytes() const override {
    return owns_dev_ ? static_cast<int64_t>(dev_->bytes()) : 0;
  }
  std::string device() const override { return "cuda:0"; }

 protected:
  explicit HostCallPreparedKernel(const LayerWeights& weights) : weights_(weights) {}
  // Takes the stream pool and the layer's device copy (uploading it if this is the first CUDA
  // kernel of the layer).
  absl::Status attach();
  // One call on device pointers (DeviceEnqueue's contract).
  virtual absl::Status enqueue(const DeviceRunArgs& args, void* scratch, cudaStream_t stream,
                               const StageEvents* events,
                               const DeviceDebugOutputs* debug) const = 0;
  // One row of zeros through `run`: CUDA loads kernels lazily, which would otherwise make the
  // layer's first request slower.
  absl::Status warm_up() const;

  const LayerWeights& weights_;
  StreamPool* pool_ = nullptr;
  std::shared_ptr<const DeviceLayer> dev_;
  bool owns_dev_ = false;

 private:
  absl::Status run_host(const RunArgs& args, RunTimings* timings, DebugOutputs* debug) const;
};

// The layer's activation quantization (scheme and static parameters) as the quantize kernels take
// it.
inline QuantizeParams quantize_params(const LayerConfig& c) {
  QuantizeParams p;
  p.scheme = static_cast<QuantScheme>(c.scheme);
  p.input_scale = c.input_scale;
  p.input_zero_point = c.input_zero_point;
  return p;
}

// The layer checks shared by the kernels that move whole 16-byte rows (TMA or 16-byte loads):
// K <= kMaxK, and K and N multiples of 16, each failure FAILED_PRECONDITION naming the value and
// `why`, e.g. "K=100 is not a multiple of 16 (16-byte bulk copies)".
absl::Status check_rows_of_16_bytes(const LayerConfig& config, absl::string_view k_why,
                                    absl::string_view n_why);

}  // namespace qlinear::gpu
