// Host-side plumbing shared by the CUDA kernel families: CUDA/cuBLASLt errors as absl::Status,
// the compiled-architecture check behind every `is_supported`, RAII device and pinned buffers,
// the pool of stream contexts that requests run on, and the interface of a prepared CUDA kernel
// (device-pointer entry points for benchmarks and a debug entry for tests).
//
// Compiled by the host compiler only (it includes Abseil); .cu files never include it.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/core/host_info.h"
#include "kernels/core/kernel.h"

namespace qlinear::gpu {

// A failed CUDA runtime call as a status: out of memory is RESOURCE_EXHAUSTED, anything else
// INTERNAL; the message names the call, the error and the source line. Clears the runtime's
// last-error slot so that a non-sticky error does not leak into the next call. An error that
// leaves the context unusable (is_context_fatal), and that the context still returns to a
// synchronization after it, is also reported as the process's device fault
// (kernels/core/device_fault.h), and its message says the process must restart.
absl::Status cuda_error_status(cudaError_t error, absl::string_view what, const char* file,
                               int line);
// The same, given what a synchronization after the error returned (`after`: the test of whether
// a fatal-looking error stays).
absl::Status cuda_error_status_after(cudaError_t error, cudaError_t after, absl::string_view what,
                                     const char* file, int line);

// Whether `error` leaves the process's CUDA context unusable, every later call failing with it
// ("sticky": the runtime's documentation says the process must be terminated and relaunched),
// or means the device itself failed (an uncorrectable ECC or NVLink error).
bool is_context_fatal(cudaError_t error);
// The same for a cuBLAS/cuBLASLt status (passed as int to keep cublas headers out of here).
absl::Status cublas_error_status(int status, absl::string_view what, const char* file, int line);

}  // namespace qlinear::gpu

// Return from the enclosing function (which returns absl::Status or StatusOr) when a CUDA runtime
// call fails.
#define RETURN_IF_CUDA_ERROR(expr)                                                       \
  do {                                                                                   \
    const cudaError_t _ql_cuda_err = (expr);                                             \
    if (_ql_cuda_err != cudaSuccess) {                                                   \
      return ::qlinear::gpu::cuda_error_status(_ql_cuda_err, #expr, __FILE__, __LINE__); \
    }                                                                                    \
  } while (0)

// The same for cuBLAS/cuBLASLt calls.
#define RETURN_IF_CUBLAS_ERROR(expr)                                                        \
  do {                                                                                      \
    const int _ql_cublas_st = static_cast<int>(expr);                                       \
    if (_ql_cublas_st != 0) {                                                               \
      return ::qlinear::gpu::cublas_error_status(_ql_cublas_st, #expr, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

namespace qlinear::gpu {

// The CUDA architectures this binary was compiled for, as CMAKE_CUDA_ARCHITECTURES spelled them
// (e.g. "90a" or "80;89;90a").
absl::string_view compiled_cuda_archs();

// Whether code compiled for `archs` (CMake spelling: 80, 90a, 89-real, 80-virtual, ...) runs on a
// device of compute capability major.minor: machine code for sm_XY runs on X.Y' with Y' >= Y,
// for sm_XYa only on X.Y; PTX for compute_XY is compiled by the driver for any capability >= X.Y
// (for compute_XYa only X.Y). OK, or the reason, e.g. "compiled for sm_90a, device is sm_80".
absl::Status check_cuda_arch(absl::string_view archs, int cc_major, int cc_minor);

// The usual gate of a CUDA kernel: compiled in, a device present, code for its capability.
// Reasons: "built without CUDA", "no CUDA device (cudaErrorNoDevice: ...)", "compiled for ...".
absl::Status cuda_device_usable(const HostInfo& host);

// Device memory; freed on destruction. Not thread-safe.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;

  // Allocates exactly `bytes` (dropping the old contents). Out of memory is RESOURCE_EXHAUSTED
  // naming `what` and the device's free memory.
  absl::Status allocate(size_t bytes, absl::string_view what);
  // Grows to at least `bytes` (1.5x steps, contents dropped); no-op when already large enough.
  // A growth that does not fit keeps the old buffer (see `grow` in cuda_context.cc).
  absl::Status reserve(size_t bytes, absl::string_view what);
  void reset();

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return size_; }

  void swap(DeviceBuffer& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Page-locked host memory (cudaHostAlloc, mapped into the device's address space) for
// asynchronous copies and for kernels that copy to and from it (mapped_copy.h); same contract as
// DeviceBuffer.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  absl::Status reserve(size_t bytes, absl::string_view what);
  void reset();
  void* get() const { return ptr_; }
  // The device's pointer to the same bytes (cudaHostGetDevicePointer); null if it has none.
  void* device_alias() const { return device_alias_; }
  size_t size() const { return size_; }
  void swap(PinnedBuffer& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(device_alias_, o.device_alias_);
    std::swap(size_, o.size_);
  }

 private:
  void* ptr_ = nullptr;
  void* device_alias_ = nullptr;
  size_t size_ = 0;
};

// Rounds `bytes` up to the 256-byte alignment that cudaMalloc gives, so that sub-buffers carved
// out of one allocation keep it (cuBLASLt and the vector loads want 16 bytes at least).
inline size_t align_up(size_t bytes) { return (bytes + 255) & ~size_t{255}; }

// A sub-buffer `offset` bytes into `base` (offsets from align_up keep the alignment).
template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

// The median of `samples` (of an even count, the upper middle one), which it reorders; at least
// one sample.
double median_of(std::vector<double>& samples);

// Of several candidates' timings, the index of the one whose median is lowest (the first of
// equal ones); each candidate's samples are reordered, and each holds at least one.
size_t lowest_median(std::vector<std::vector<double>>& samples);

// The current device's L2 cache size in bytes.
absl::StatusOr<int64_t> device_l2_bytes();

// Times calls for load-time choices (autotune, tile tuning): a private stream, two events and,
// from the first cold timing on, a buffer of 4x the L2 (at least 128 MiB) whose read-only pass
// before a timed call leaves the L2 cold, as a served layer finds it (its weights were read a
// layer ago; reading rather than writing leaves no dirty lines to write back during the call).
// Synchronises after every call.
class CallTimer {
 public:
  static absl::StatusOr<std::unique_ptr<CallTimer>> create();
  ~CallTimer();
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;

  cudaStream_t stream() const { return stream_; }
  // The median of `reps` calls in us; `call` enqueues one on stream(); cold: the L2 pass first.
  absl::StatusOr<double> median_us(int reps, bool cold,
                                   absl::FunctionRef<absl::Status(cudaStream_t)> call);
  // The same, with `prime` enqueued after each cold call's L2 pass and before its timing starts
  // (untimed): what the caller wants back in L2 before the call, such as its code and inputs.
  absl::StatusOr<double> median_us(int reps, bool cold,
                                   absl::FunctionRef<absl::Status(cudaStream_t)> call,
                                   absl::FunctionRef<absl::Status(cudaStream_t)> prime);
  // Allocates the cold timings' buffer now (otherwise the first cold timing does), so that a
  // caller can size its own buffers to the memory left.
  absl::Status reserve_cold() { return ensure_flush(); }

 private:
  CallTimer() = default;
  // Allocates and initialises flush_ unless it already is.
  absl::Status ensure_flush();
  DeviceBuffer flush_, sink_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
};

// One worker's slot on the GPU: a stream, timing events and the buffers a request needs, grown
// to the largest request seen (so no cudaMalloc once warm) and trimmed back to the reservation
// once idle (StreamPool::trim). Owned by the StreamPool; use it only while holding `mu` (a
// StreamLease does that).
struct StreamContext {
  static constexpr int kCopyEvents = 8;
  std::mutex mu;
  int index = 0;  // in the pool, 0 .. StreamPool::kContexts - 1
  cudaStream_t stream = nullptr;
  cudaEvent_t events[3] = {nullptr, nullptr, nullptr};  // quantize start, GEMM start, end
  cudaEvent_t copy_events[kCopyEvents] = {};            // arrival of chunked copies (no timing)
  DeviceBuffer device;  // x, y, sa, azp and the kernel's scratch (incl. cuBLASLt workspace)
  PinnedBuffer host;    // staging for x, y, sa, azp and the bad-row flag
  // The larger of the device and host bytes the call holding the context needs (0: none yet),
  // and when a call that needed more than the pool keeps last let go of it (StreamPool::trim).
  size_t call_bytes = 0;
  std::chrono::steady_clock::time_point last_large{};
  // The buffers' sizes, for readers that do not hold `mu` (StreamPool::staging_bytes).
  std::atomic<size_t> device_bytes{0}, host_bytes{0};
  // Publishes the buffers' sizes after they changed (under `mu`).
  void sizes_changed() {
    device_bytes.store(device.size(), std::memory_order_relaxed);
    host_bytes.store(host.size(), std::memory_order_relaxed);
  }
};

// The process-wide pool of stream contexts on cuda:0. Concurrent requests take different
// contexts, so their copies and kernels overlap on different streams; a request that finds every
// context busy waits for one. Created on first use; intentionally never destroyed (CUDA objects
// must not be released from static destructors after the runtime has shut down).
class StreamPool {
 public:
  static constexpr int kContexts = 4;

  // The pool, creating it (streams, events) on first call. Fails if no device can be used.
  static absl::StatusOr<StreamPool*> get();

  // The pool if it was created (get() succeeded), else null; creates nothing.
  static StreamPool* existing() { return created_.load(std::memory_order_acquire); }

  StreamContext* acquire();  // returned locked
  // Unlocks `ctx`, noting when its call needed more than the pool keeps (see trim).
  void release(StreamContext* ctx);

  // Grows every context's pinned and device buffers to at least `bytes` each now (waiting for a
  // context that is in use), so that no request whose staging fits allocates, and makes `bytes`
  // what each context keeps (keep_bytes). On the first failure it frees every context's buffers
  // (they grow again on demand), keeps nothing, and returns it.
  absl::Status reserve_all(size_t bytes);

  // What trim leaves each context's pinned and device buffers: the last reservation (0 without
  // one).
  size_t keep_bytes() const { return keep_bytes_.load(std::memory_order_relaxed); }

  // Shrinks, back to keep_bytes() each, the buffers of every context that holds more and whose
  // last call needing more let go of it at least `idle` ago (or that never had such a call); a
  // context in use is skipped. The kept buffers are allocated, and the old ones freed (which
  // waits for the device's work in flight), without the context's lock: it is held only to
  // swap them, so a request that takes the context meanwhile does not wait. For a housekeeping
  // thread, not a request. A kept buffer that cannot be allocated leaves the context without
  // one (it grows on demand). The pool is process-wide: every caller trims every context.
  // Returns the bytes released (pinned and device together).
  size_t trim(std::chrono::steady_clock::duration idle);

  // What the contexts hold now, in all (a snapshot, without waiting for a context in use).
  struct Bytes {
    size_t host = 0;    // pinned host memory
    size_t device = 0;  // GPU memory
  };
  Bytes staging_bytes() const;

 private:
  StreamPool() = default;
  static std::atomic<StreamPool*> created_;
  std::vector<std::unique_ptr<StreamContext>> contexts_;
  std::atomic<uint32_t> next_{0};
  std::atomic<size_t> keep_bytes_{0};
};

// Holds a StreamContext for one request.
class StreamLease {
 public:
  explicit StreamLease(StreamPool* pool) : pool_(pool), ctx_(pool->acquire()) {}
  ~StreamLease() { pool_->release(ctx_); }
  StreamLease(const StreamLease&) = delete;
  StreamLease& operator=(const StreamLease&) = delete;
  StreamContext* operator->() const { return ctx_; }
  StreamContext* get() const { return ctx_; }

 private:
  StreamPool* pool_;
  StreamContext* ctx_;
};

// Device pointers for one call of a prepared CUDA kernel. x [m, k] in x_dtype, y [m, n] in
// y_dtype; sa [m] and azp [m] may be null (then the kernel keeps them in its scratch). sa_host and
// azp_host, where not null (a kernel that writes its outputs straight to the host, see
// HostCallPreparedKernel::outputs_direct), are mapped pinned memory where the call writes sa and
// azp as well.
struct DeviceRunArgs {
  const void* x = nullptr;
  DType x_dtype = DType::kBF16;
  int64_t m = 0;
  void* y = nullptr;
  DType y_dtype = DType::kBF16;
  float* sa = nullptr;
  int32_t* azp = nullptr;
  float* sa_host = nullptr;
  int32_t* azp_host = nullptr;
  // x lies in mapped pinned host memory (its device alias): a kernel reading it more than once
  // would read it across PCIe each time.
  bool x_in_host_memory = false;
};

// Optional events recorded around the stages of run_device: [0] before quantization, [1] before
// the GEMM, [2] after the epilogue. in_graph: the call is being captured into a CUDA graph, whose
// replays are to record the events (a plain record under capture only orders the capture).
struct StageEvents {
  cudaEvent_t e[3] = {nullptr, nullptr, nullptr};
  bool in_graph = false;
};

// Records stage event i of `events` (none: nothing) on `stream`, as an event node of the graph
// when the call is being captured.
inline cudaError_t record_stage(const StageEvents* events, int i, cudaStream_t stream) {
  if (events == nullptr || events->e[i] == nullptr) return cudaSuccess;
  return cudaEventRecordWithFlags(events->e[i], stream,
                                  events->in_graph ? cudaEventRecordExternal : 0u);
}

// Every intermediate of one call, for differential tests against the reference.
struct DebugOutputs {
  std::vector<int8_t> xq;    // [m, k]
  std::vector<float> sa;     // [m]
  std::vector<int32_t> azp;  // [m] (asymmetric schemes; zeros otherwise)
  std::vector<int32_t> acc;  // [m, n] row-major
};

// Writes `count` made-up activations of `type` to device memory x: deterministic values in
// [-1, 1), so that quantization does real work (and every kernel measured on a layer sees the same
// input). A short pattern made on the host, repeated by device copies on `stream`, which it
// synchronises. For load-time measurements.
absl::Status fill_made_up_activations(void* x, DType type, size_t count, cudaStream_t stream);

// A prepared CUDA kernel. `run` (PreparedKernel) takes host pointers: it stages x through pinned
// memory, runs on a pooled stream and synchronises once. The entries below serve tests and
// benchmarks.
class CudaPreparedKernel : public PreparedKernel {
 public:
  // Bytes of device scratch that run_device needs for m rows (256-byte aligned pointer).
  virtual size_t device_scratch_bytes(int64_t m) const = 0;
  // Enqueues quantize + GEMM + epilogue on `stream` with device pointers and returns without
  // synchronising: no host copies, no allocation. A row holding NaN/Inf gets sa = NaN (in args.sa
  // when given) and unspecified outputs; `run` turns that into INVALID_ARGUMENT. `scratch` must
  // not be in use by another call in flight.
  virtual absl::Status run_device(const DeviceRunArgs& args, void* scratch, cudaStream_t stream,
                                  const StageEvents* events) const = 0;
  // `run` that also returns every intermediate (xq, sa, azp, acc).
  virtual absl::Status run_debug(const RunArgs& args, DebugOutputs* debug) const = 0;

  // Autotune, once for every CUDA kernel: run_device on a stream of its own with device buffers
  // for x (random values in [-1, 1), so quantization does real work), y and the scratch; a few
  // untimed calls, then the median of timed calls, each preceded by a read of a buffer several
  // times the L2 so that the weights come from device memory. Times the device work between two
  // events (a kernel on the serving path also times the copies of a small call, which depend on
  // the kernel: HostCallPreparedKernel::measure_us). Every buffer, stream and event is released
  // before returning, on errors too.
  absl::StatusOr<double> measure_us(const ProblemShape& shape) const override {
    return measure_us(shape, /*cold=*/true);
  }
  // The same, the L2 read before each timed call only when `cold` (otherwise the calls run back
  // to back).
  virtual absl::StatusOr<double> measure_us(const ProblemShape& shape, bool cold) const;

 protected:
  // The calls of one measurement on `timer`'s stream: a few untimed, then the median of the
  // timed ones (`cold`: each after the L2 read).
  static absl::StatusOr<double> time_measured_calls(
      CallTimer& timer, bool cold, absl::FunctionRef<absl::Status(cudaStream_t)> call);
};

}  // namespace qlinear::gpu
