// The serving path shared by the CUDA kernels (cuda.gemv_s8, cuda.stream_s8, cuda.cutlass_sm90,
// cuda.cublaslt): one call on host buffers, run on a pooled stream context.
//
//   x: host -> pinned -> device in chunks (the host memcpy of one chunk overlaps the DMA of the
//   previous one); the kernel family's device half; sa/azp back first, then y in chunks, each
//   copied out of pinned memory as soon as its event fires; one stream synchronisation at the end.
//   An output of up to 2 MB comes back in one copy (y, sa and azp together). Copies of up to
//   1 MB between the pinned and device buffers are done by a small kernel on the mapped pinned
//   memory instead of the copy engine (lower latency), a quantize kernel that alone reads x
//   takes a small x from the pinned buffer directly, and a device half that can (outputs_direct)
//   writes a small y, sa and azp into the pinned buffer itself (no output copy). x copies of 256
//   KB or more into pinned memory use streaming stores. Host copies of 512 KB or more are split
//   among a pool of four copy threads. Calls of up to kMaxGraphRows rows replay a CUDA graph of the
//   input copy, the device half and the output copy (CallGraphs), captured on the second call of
//   that size on a stream context. A non-finite row (sa = NaN from the GPU) becomes
//   INVALID_ARGUMENT with the reference's exact message and leaves y untouched.
//
// No allocation once the context's buffers have grown to the largest request seen (until an idle
// trim gives back what they grew past the reservation: StreamPool::trim); no descriptor creation
// here (each family keeps its handles with the layer).
//
// Host compiler only (Abseil).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
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

// The most rows a call may have for its GPU work to be replayed from a CUDA graph (decode and
// small batches; on the H200 a replay saved 4-9 us at M = 16 and 64, against 5-12 us at M = 1).
constexpr int64_t kMaxGraphRows = 64;
// The most graphs the process keeps (over every layer, kernel and stream context); calls beyond
// it run without one.
constexpr int kMaxGraphs = 4096;

// The CUDA graphs of one prepared kernel's small calls: per stream context, one per (M, dtypes)
// of up to kMaxGraphRows rows. A call of a given size on a context runs eagerly the first time
// (so that whatever CUDA loads lazily is loaded outside a capture) and is captured the second;
// later ones replay the graph: one submission for the input copy, the kernels and the output
// copy instead of one each. The graph holds no timing event: a replay is timed on the host clock
// (RunTimings). Measured on the H200 (bench --serving: 4096 x 4096 at M = 1, x in, op, y | sa |
// azp out, synchronised; host clock, median us, two runs):
//                                            cuda.stream_s8   cuda.cutlass_sm90
//   queued one by one, stage events          34.7 / 31.6      39.2 / 45.0
//   one graph, no event                      27.6 / 29.6      28.6 / 28.6
//   one graph, stage events as its nodes     30.7 / 32.8      32.4 / 33.7
//   one graph, two events around its launch  36.9 / 38.8      36.8 / 38.9
//   one graph, event nodes at its two ends   45.0 / 38.8      45.0 / 38.9
// An instantiated graph of such a call holds 5-38 KB of host memory (and 96 KB of device memory
// for cuda.gemv_s8), so kMaxGraphs of them at most about 160 MB. A call whose capture fails runs
// eagerly, as do the next calls of that size on that context, 16 after a first failure, twice as
// many after each further one, up to 4096 (see Entry): the capture is tried again then, so that
// one failure (the device's memory short for a moment) does not leave a size eager for good. A
// call that finds kMaxGraphs graphs live runs eagerly, and its size looks again after 64 calls
// (graphs are freed as layers are replaced or unloaded). A context's graphs are only touched
// while its lease is held. Destroying the object destroys its graphs.
class CallGraphs {
 public:
  CallGraphs() = default;
  ~CallGraphs();
  CallGraphs(const CallGraphs&) = delete;
  CallGraphs& operator=(const CallGraphs&) = delete;

  // The live graphs of the whole process.
  static int live();

  struct Entry {
    int64_t m = 0;
    DType x_dtype = DType::kBF16, y_dtype = DType::kBF16;
    const void* device = nullptr;  // the context's buffers the graph was captured on
    const void* host = nullptr;
    cudaGraphExec_t exec = nullptr;
    int failures = 0;         // captures that failed in a row
    int64_t eager_calls = 0;  // calls to run eagerly before the next capture is tried

    // Whether this call may replay or capture the graph (otherwise it runs eagerly); counts the
    // eager calls down.
    bool graph_turn() {
      if (eager_calls == 0) return true;
      --eager_calls;
      return false;
    }
    // After a capture that failed: the next calls run eagerly, kFirstRetryCalls of them after the
    // first failure, twice as many after each further one, at most kMaxRetryCalls.
    void capture_failed() {
      failures = std::min(failures + 1, 16);
      eager_calls = std::min<int64_t>(kFirstRetryCalls << (failures - 1), kMaxRetryCalls);
    }
    // After a call found kMaxGraphs graphs live: kLimitRecheckCalls calls run eagerly.
    void at_graph_limit() { eager_calls = kLimitRecheckCalls; }
    void captured(cudaGraphExec_t e) {
      exec = e;
      failures = 0;
      eager_calls = 0;
    }
  };
  static constexpr int64_t kFirstRetryCalls = 16;
  static constexpr int64_t kMaxRetryCalls = 4096;
  static constexpr int64_t kLimitRecheckCalls = 64;
  // The entry of a call of `m` rows on context `ctx` with these buffers; null the first time
  // (the call runs eagerly and the entry is made). An entry captured on other buffers (the
  // context's grew) is reset.
  Entry* find(int ctx, int64_t m, DType x_dtype, DType y_dtype, const void* device,
              const void* host);

 private:
  std::vector<Entry> by_context_[StreamPool::kContexts];
};

// Runs one call of a layer with config `c` on host buffers (see the top of this file). timings:
// quantize_ns from event 0 to 1, gemm_ns from 1 to 2 (a fused kernel records 0 and 1 together).
// debug: every intermediate, for the differential tests. graphs: where small calls keep their
// graphs (null: none). x_read_once: the device half reads x in one pass of the quantize kernel
// only, so a small x is handed to it in the mapped pinned buffer instead of being copied to the
// device first. outputs_direct: the device half writes y into mapped pinned memory as well as
// device memory (it never reads y back) and writes sa and azp to DeviceRunArgs::sa_host and
// azp_host as well, so a small output (up to direct_output_bytes() of y) is handed to it there
// and not copied back (not for debug calls).
absl::Status run_on_host_buffers(StreamPool* pool, const LayerConfig& c, const RunArgs& args,
                                 size_t scratch_bytes, DeviceEnqueue enqueue, RunTimings* timings,
                                 DebugOutputs* debug, CallGraphs* graphs = nullptr,
                                 bool x_read_once = false, bool outputs_direct = false);

// The largest y a kernel that can writes straight into mapped pinned memory (see
// kDirectOutputBytes in cuda_host_call.cc; 0: never). Process-wide, for the benchmark's
// comparisons; a call already captured in a graph keeps the form it was captured with until its
// context's buffers change.
void set_direct_output_bytes(size_t bytes);
size_t direct_output_bytes();

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
  // A call whose copies the serving path does by a kernel (x and the outputs up to 1 MB each) is
  // timed as served: x read from mapped pinned memory or copied in from it, and the outputs
  // written straight there or copied back, as run() would for this kernel (x_read_once,
  // outputs_direct); so that the load-time choice between kernels weighs what each call's copies
  // cost on the GPU. Larger calls: the device work alone (CudaPreparedKernel::measure_us).
  absl::StatusOr<double> measure_us(const ProblemShape& shape, bool cold) const override;
  using CudaPreparedKernel::measure_us;

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
  // Whether this call's device half reads x only in one pass of the quantize kernel (which may
  // then read it from mapped pinned memory; see run_on_host_buffers).
  virtual bool x_read_once(const RunArgs& args) const {
    (void)args;
    return false;
  }
  // Whether this call's device half can write y into mapped pinned memory (it never reads it
  // back) and honours DeviceRunArgs::sa_host and azp_host (see run_on_host_buffers).
  virtual bool outputs_direct(const RunArgs& args) const {
    (void)args;
    return false;
  }

  const LayerWeights& weights_;
  StreamPool* pool_ = nullptr;
  std::shared_ptr<const DeviceLayer> dev_;
  bool owns_dev_ = false;
  mutable CallGraphs graphs_;

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
