#include "kernels/cuda/cuda_context.h"

#include <cublasLt.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/core/device_fault.h"
#include "kernels/core/dtype.h"
#include "kernels/core/status.h"
#include "kernels/cuda/cuda_arch.h"  // generated: QLINEAR_CUDA_ARCHS
#include "kernels/cuda/l2_flush.h"

namespace qlinear::gpu {
namespace {

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash == nullptr ? path : slash + 1;
}

std::string memory_note() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return absl::StrCat(" (", free_bytes >> 20, " MiB free of ", total_bytes >> 20, " MiB)");
}

// One entry of CMAKE_CUDA_ARCHITECTURES, e.g. "90a", "89-real", "80-virtual".
struct ArchEntry {
  int major = 0;
  int minor = 0;
  char suffix = 0;  // 0, 'a' (this exact capability) or 'f' (the family)
  bool sass = true;
  bool ptx = true;
  std::string spelled;  // "sm_90a"
};

bool parse_arch(absl::string_view s, ArchEntry* e) {
  if (absl::ConsumeSuffix(&s, "-real")) {
    e->ptx = false;
  } else if (absl::ConsumeSuffix(&s, "-virtual")) {
    e->sass = false;
  }
  if (!s.empty() && (s.back() == 'a' || s.back() == 'f')) {
    e->suffix = s.back();
    s.remove_suffix(1);
  }
  int num = 0;
  if (s.size() < 2 || !absl::SimpleAtoi(s, &num) || num < 10) return false;
  e->major = num / 10;
  e->minor = num % 10;
  e->spelled = absl::StrCat(e->sass ? "sm_" : "compute_", num,
                            e->suffix ? std::string(1, e->suffix) : std::string());
  return true;
}

bool arch_runs_on(const ArchEntry& e, int major, int minor) {
  const bool same_major = major == e.major && minor >= e.minor;
  const bool exact = major == e.major && minor == e.minor;
  if (e.sass && (e.suffix == 'a' ? exact : same_major)) return true;
  if (e.ptx) {
    if (e.suffix == 'a') return exact;
    if (e.suffix == 'f') return same_major;
    return major > e.major || same_major;
  }
  return false;
}

}  // namespace

bool is_context_fatal(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorContained:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
      return true;
    default:
      return false;
  }
}

absl::Status cuda_error_status(cudaError_t error, absl::string_view what, const char* file,
                               int line) {
  // A fatal error stays: the context returns it to every later call. One that does not (a code
  // reported for a launch that was merely refused, say) was not fatal after all.
  const cudaError_t after = is_context_fatal(error) ? cudaDeviceSynchronize() : cudaSuccess;
  return cuda_error_status_after(error, after, what, file, line);
}

absl::Status cuda_error_status_after(cudaError_t error, cudaError_t after, absl::string_view what,
                                     const char* file, int line) {
  cudaGetLastError();  // a non-sticky error must not fail the next, unrelated call
  std::string msg = absl::StrCat("CUDA error in ", what, " (", base_name(file), ":", line,
                                 "): ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(absl::StrCat(msg, memory_note()));
  }
  if (is_context_fatal(error) && is_context_fatal(after)) {
    absl::StrAppend(&msg, "; the GPU cannot serve again in this process, which must restart");
    report_device_fault(msg);
  }
  return absl::InternalError(msg);
}

absl::Status cublas_error_status(int status, absl::string_view what, const char* file, int line) {
  const auto st = static_cast<cublasStatus_t>(status);
  std::string msg = absl::StrCat("cuBLASLt error in ", what, " (", base_name(file), ":", line,
                                 "): ", cublasLtGetStatusName(st));
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::string_view compiled_cuda_archs() { return QLINEAR_CUDA_ARCHS; }

absl::Status check_cuda_arch(absl::string_view archs, int cc_major, int cc_minor) {
  std::vector<std::string> spelled;
  for (absl::string_view raw : absl::StrSplit(archs, absl::ByAnyChar(";, "), absl::SkipEmpty())) {
    if (raw == "all" || raw == "all-major" || raw == "native") {
      return absl::OkStatus();  // CMake chose the list; the first launch tells
    }
    ArchEntry e;
    if (!parse_arch(raw, &e)) continue;
    if (arch_runs_on(e, cc_major, cc_minor)) return absl::OkStatus();
    spelled.push_back(e.spelled);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "compiled for ", spelled.empty() ? "no CUDA architecture" : absl::StrJoin(spelled, ", "),
      ", device is sm_", cc_major, cc_minor));
}

absl::Status cuda_device_usable(const HostInfo& host) {
  if (!host.cuda_compiled) return absl::FailedPreconditionError("built without CUDA");
  if (host.gpus.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device", host.cuda_error.empty() ? "" : absl::StrCat(" (", host.cuda_error, ")")));
  }
  const GpuInfo& g = host.gpus[0];
  return check_cuda_arch(compiled_cuda_archs(), g.cc_major, g.cc_minor);
}

// --- DeviceBuffer / PinnedBuffer --------------------------------------------------------------

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() {
  // A failure here (the device already faulted, the runtime shutting down) has no one to report
  // to; it must not stay in this thread's last-error slot, where the next launch's check would
  // take it for its own.
  if (ptr_ != nullptr && cudaFree(ptr_) != cudaSuccess) cudaGetLastError();
  ptr_ = nullptr;
  size_ = 0;
}

absl::Status DeviceBuffer::allocate(size_t bytes, absl::string_view what) {
  reset();
  if (bytes == 0) return absl::OkStatus();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat("out of GPU memory on cuda:0 allocating ",
                                                     bytes, " bytes for ", what, memory_note()));
  }
  if (e != cudaSuccess)
    return cuda_error_status(e, absl::StrCat("cudaMalloc for ", what), __FILE__, __LINE__);
  ptr_ = p;
  size_ = bytes;
  return absl::OkStatus();
}

namespace {

// How both buffers grow to at least `bytes` (1.5x steps): the new allocation is made while the
// old one is still held, so that a growth that does not fit leaves the buffer as it was (a stream
// context keeps its reserved staging through a request too large for the memory left). Only
// where that fails for lack of memory and `room_if_freed(bytes)` says that freeing the old one
// would make room is it freed and the growth tried again, the old size allocated again where
// even that fails. `alloc` is cudaMalloc or cudaHostAlloc, `release` frees what it gave.
template <typename Alloc, typename Release, typename RoomIfFreed>
cudaError_t grow(void** ptr, size_t* size, size_t bytes, Alloc alloc, Release release,
                 RoomIfFreed room_if_freed) {
  const size_t old = *size;
  const size_t grown = std::max(bytes, old + old / 2);
  auto attempt = [&]() -> cudaError_t {
    cudaError_t e = cudaSuccess;
    for (const size_t want : {grown, bytes}) {
      void* p = nullptr;
      e = alloc(&p, want);
      if (e == cudaSuccess) {
        if (*ptr != nullptr) release(*ptr);
        *ptr = p;
        *size = want;
        return e;
      }
      cudaGetLastError();
      if (e != cudaErrorMemoryAllocation || grown == bytes) return e;
    }
    return e;
  };
  cudaError_t e = attempt();
  if (e != cudaErrorMemoryAllocation || *ptr == nullptr || !room_if_freed(bytes)) return e;
  release(*ptr);
  *ptr = nullptr;
  *size = 0;
  e = attempt();
  if (e != cudaSuccess) {
    void* p = nullptr;
    if (alloc(&p, old) == cudaSuccess) {
      *ptr = p;
      *size = old;
    } else {
      cudaGetLastError();
    }
  }
  return e;
}

void free_device(void* p) {
  if (cudaFree(p) != cudaSuccess) cudaGetLastError();  // see DeviceBuffer::reset
}

void free_pinned(void* p) {
  if (cudaFreeHost(p) != cudaSuccess) cudaGetLastError();  // see DeviceBuffer::reset
}

}  // namespace

absl::Status DeviceBuffer::reserve(size_t bytes, absl::string_view what) {
  if (bytes <= size_) return absl::OkStatus();
  // The device says what freeing the old buffer would leave.
  const size_t old = size_;
  auto room_if_freed = [old](size_t want) {
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return free_bytes + old >= want;
  };
  const cudaError_t e = grow(
      &ptr_, &size_, bytes, [](void** p, size_t n) { return cudaMalloc(p, n); }, free_device,
      room_if_freed);
  if (e == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(absl::StrCat("out of GPU memory on cuda:0 allocating ",
                                                     bytes, " bytes for ", what, memory_note()));
  }
  if (e != cudaSuccess) {
    return cuda_error_status(e, absl::StrCat("cudaMalloc for ", what), __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

PinnedBuffer::~PinnedBuffer() { reset(); }

void PinnedBuffer::reset() {
  if (ptr_ != nullptr && cudaFreeHost(ptr_) != cudaSuccess) cudaGetLastError();  // see above
  ptr_ = nullptr;
  device_alias_ = nullptr;
  size_ = 0;
}

absl::Status PinnedBuffer::reserve(size_t bytes, absl::string_view what) {
  if (bytes <= size_) return absl::OkStatus();
  // Host memory has no such figure here: freeing the old buffer is tried only where it is at
  // least half of what is asked for.
  const size_t old = size_;
  const cudaError_t e = grow(
      &ptr_, &size_, bytes,
      [](void** p, size_t n) { return cudaHostAlloc(p, n, cudaHostAllocMapped); }, free_pinned,
      [old](size_t want) { return old >= want / 2; });
  device_alias_ = nullptr;
  if (ptr_ != nullptr && cudaHostGetDevicePointer(&device_alias_, ptr_, 0) != cudaSuccess) {
    cudaGetLastError();
    device_alias_ = nullptr;
  }
  if (e == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of pinned host memory allocating ", bytes, " bytes for ", what));
  }
  if (e != cudaSuccess) {
    return cuda_error_status(e, absl::StrCat("cudaHostAlloc for ", what), __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

// --- StreamPool -------------------------------------------------------------------------------

absl::StatusOr<StreamPool*> StreamPool::get() {
  static const absl::StatusOr<StreamPool*> pool = []() -> absl::StatusOr<StreamPool*> {
    auto* p = new StreamPool();  // never freed: see the class comment
    for (int i = 0; i < kContexts; ++i) {
      auto ctx = std::make_unique<StreamContext>();
      ctx->index = i;
      RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
      for (cudaEvent_t& e : ctx->events) RETURN_IF_CUDA_ERROR(cudaEventCreate(&e));
      for (cudaEvent_t& e : ctx->copy_events) {
        RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      }
      p->contexts_.push_back(std::move(ctx));
    }
    created_.store(p, std::memory_order_release);
    return p;
  }();
  return pool;
}

std::atomic<StreamPool*> StreamPool::created_{nullptr};

void StreamPool::release(StreamContext* ctx) {
  if (ctx->call_bytes > keep_bytes()) ctx->last_large = std::chrono::steady_clock::now();
  ctx->call_bytes = 0;
  ctx->mu.unlock();
}

absl::Status StreamPool::reserve_all(size_t bytes) {
  // Kept from before the first context holds it, so that a trim meanwhile does not take it back.
  keep_bytes_.store(std::max(keep_bytes(), bytes), std::memory_order_relaxed);
  absl::Status status;
  for (const std::unique_ptr<StreamContext>& ctx : contexts_) {
    std::lock_guard<std::mutex> lock(ctx->mu);
    status = ctx->device.reserve(bytes, "the GPU staging reserved at start-up");
    if (status.ok()) status = ctx->host.reserve(bytes, "the GPU staging reserved at start-up");
    ctx->sizes_changed();
    if (!status.ok()) break;
  }
  keep_bytes_.store(status.ok() ? bytes : 0, std::memory_order_relaxed);
  if (status.ok()) return status;
  // A reservation that does not fit leaves nothing behind: every context's buffers are freed
  // (they grow again on demand), so that a part of it cannot hold memory that layers need.
  for (const std::unique_ptr<StreamContext>& ctx : contexts_) {
    std::lock_guard<std::mutex> lock(ctx->mu);
    ctx->device.reset();
    ctx->host.reset();
    ctx->sizes_changed();
  }
  return status;
}

size_t StreamPool::trim(std::chrono::steady_clock::duration idle) {
  const size_t keep = keep_bytes();
  size_t released = 0;
  // Whether `ctx` is to be trimmed now (under its lock).
  auto due = [&](const StreamContext& ctx) {
    return (ctx.device.size() > keep || ctx.host.size() > keep) &&
           std::chrono::steady_clock::now() - ctx.last_large >= idle;
  };
  for (const std::unique_ptr<StreamContext>& ctx : contexts_) {
    bool device_over = false, host_over = false;
    {
      std::unique_lock<std::mutex> lock(ctx->mu, std::try_to_lock);
      if (!lock.owns_lock() || !due(*ctx)) continue;  // in use, or not due
      device_over = ctx->device.size() > keep;
      host_over = ctx->host.size() > keep;
    }
    // The kept buffers are made without the lock (pinning takes about 0.6 ms per MB)...
    DeviceBuffer device;
    PinnedBuffer host;
    const char* what = "the GPU staging kept after a trim";
    if (device_over && keep > 0 && !device.reserve(keep, what).ok()) device.reset();
    if (host_over && keep > 0 && !host.reserve(keep, what).ok()) host.reset();
    {
      // ... and swapped in where the context is still due (a request may have taken it since).
      std::unique_lock<std::mutex> lock(ctx->mu, std::try_to_lock);
      if (!lock.owns_lock() || !due(*ctx)) continue;  // (the kept buffers are freed unused)
      const size_t before = ctx->device.size() + ctx->host.size();
      if (device_over && ctx->device.size() > keep) ctx->device.swap(device);
      if (host_over && ctx->host.size() > keep) ctx->host.swap(host);
      ctx->sizes_changed();
      released += before - (ctx->device.size() + ctx->host.size());
    }
    // The old buffers are freed here, without the lock, as `device` and `host` go.
  }
  return released;
}

StreamPool::Bytes StreamPool::staging_bytes() const {
  Bytes b;
  for (const std::unique_ptr<StreamContext>& ctx : contexts_) {
    b.host += ctx->host_bytes.load(std::memory_order_relaxed);
    b.device += ctx->device_bytes.load(std::memory_order_relaxed);
  }
  return b;
}

StreamContext* StreamPool::acquire() {
  const uint32_t start = next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size();
  for (size_t i = 0; i < contexts_.size(); ++i) {
    StreamContext* c = contexts_[(start + i) % contexts_.size()].get();
    if (c->mu.try_lock()) return c;
  }
  StreamContext* c = contexts_[start].get();
  c->mu.lock();
  return c;
}

// --- CudaPreparedKernel::measure_us --------------------------------------------------------

absl::StatusOr<int64_t> device_l2_bytes() {
  int device = 0, l2_bytes = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  RETURN_IF_CUDA_ERROR(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  return l2_bytes;
}

absl::StatusOr<std::unique_ptr<CallTimer>> CallTimer::create() {
  std::unique_ptr<CallTimer> t(new CallTimer());
  RETURN_IF_ERROR(t->sink_.allocate(sizeof(uint32_t), "the L2 flush's sink"));
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&t->stream_, cudaStreamNonBlocking));
  RETURN_IF_CUDA_ERROR(cudaEventCreate(&t->start_));
  RETURN_IF_CUDA_ERROR(cudaEventCreate(&t->end_));
  return t;
}

absl::Status CallTimer::ensure_flush() {
  if (flush_.get() != nullptr) return absl::OkStatus();
  constexpr size_t kMinFlushBytes = size_t{128} << 20;  // over twice the H100/H200 L2
  ASSIGN_OR_RETURN(const int64_t l2_bytes, device_l2_bytes());
  RETURN_IF_ERROR(
      flush_.allocate(std::max(kMinFlushBytes, size_t{4} * static_cast<size_t>(l2_bytes)),
                      "an L2 flush buffer for timing"));
  // Written once here, so that the flushes read initialised memory; these lines are written back
  // before any timed call.
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(flush_.get(), 0, flush_.size(), stream_));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

CallTimer::~CallTimer() {
  // Synchronised before anything is freed, so that no work of a failed measurement still uses
  // the flush buffer or the caller's buffers (which outlive the timer).
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (start_ != nullptr) cudaEventDestroy(start_);
  if (end_ != nullptr) cudaEventDestroy(end_);
  cudaGetLastError();
}

absl::StatusOr<double> CallTimer::median_us(int reps, bool cold,
                                            absl::FunctionRef<absl::Status(cudaStream_t)> call) {
  return median_us(reps, cold, call, [](cudaStream_t) { return absl::OkStatus(); });
}

absl::StatusOr<double> CallTimer::median_us(int reps, bool cold,
                                            absl::FunctionRef<absl::Status(cudaStream_t)> call,
                                            absl::FunctionRef<absl::Status(cudaStream_t)> prime) {
  if (cold) RETURN_IF_ERROR(ensure_flush());
  std::vector<double> us;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    if (cold) {
      RETURN_IF_CUDA_ERROR(
          launch_l2_flush_read(flush_.get(), flush_.size(), sink_.as<uint32_t>(), stream_));
      RETURN_IF_ERROR(prime(stream_));
    }
    RETURN_IF_CUDA_ERROR(cudaEventRecord(start_, stream_));
    RETURN_IF_ERROR(call(stream_));
    RETURN_IF_CUDA_ERROR(cudaEventRecord(end_, stream_));
    RETURN_IF_CUDA_ERROR(cudaEventSynchronize(end_));
    float ms = 0.f;
    RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, start_, end_));
    us.push_back(1000.0 * ms);
  }
  return median_of(us);
}

double median_of(std::vector<double>& samples) {
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

size_t lowest_median(std::vector<std::vector<double>>& samples) {
  size_t best = 0;
  double best_us = 0;
  for (size_t j = 0; j < samples.size(); ++j) {
    const double m = median_of(samples[j]);
    if (j == 0 || m < best_us) {
      best = j;
      best_us = m;
    }
  }
  return best;
}

absl::Status fill_made_up_activations(void* x, DType type, size_t count, cudaStream_t stream) {
  const size_t elem = dtype_size(type);
  // A pattern of at most 64Ki elements, repeated on the device, so that a prefill-sized x costs
  // no host time.
  std::vector<char> pattern;
  try {
    pattern.resize(std::min<size_t>(count, size_t{1} << 16) * elem);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of host memory for made-up activations");
  }
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < pattern.size() / elem; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    store_from_f32(pattern.data(), type, i, 2.0f * u - 1.0f);
  }
  char* const dst = static_cast<char*>(x);
  const size_t bytes = count * elem;
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(dst, pattern.data(), pattern.size(), cudaMemcpyHostToDevice, stream));
  for (size_t filled = pattern.size(); filled < bytes; filled *= 2) {  // doubling copies
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst + filled, dst, std::min(filled, bytes - filled),
                                         cudaMemcpyDeviceToDevice, stream));
  }
  // The pattern is freed on return.
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaPreparedKernel::time_measured_calls(
    CallTimer& timer, bool cold, absl::FunctionRef<absl::Status(cudaStream_t)> call) {
  constexpr int kWarmupCalls = 3;
  constexpr int kTimedCalls = 15;
  for (int i = 0; i < kWarmupCalls; ++i) RETURN_IF_ERROR(call(timer.stream()));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(timer.stream()));
  return timer.median_us(kTimedCalls, cold, call);
}

absl::StatusOr<double> CudaPreparedKernel::measure_us(const ProblemShape& shape, bool cold) const {
  if (shape.m < 1 || shape.n < 1 || shape.k < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot measure M=", shape.m, ", N=", shape.n, ", K=", shape.k));
  }
  const size_t x_count = static_cast<size_t>(shape.m * shape.k);
  const size_t x_elem = dtype_size(shape.x_dtype);
  const size_t y_bytes = static_cast<size_t>(shape.m * shape.n) * dtype_size(shape.y_dtype);
  // Declared before the timer, so freed after its stream has been synchronised.
  DeviceBuffer x, y, scratch;
  RETURN_IF_ERROR(x.allocate(x_count * x_elem, "the measurement's activations"));
  RETURN_IF_ERROR(y.allocate(y_bytes, "the measurement's outputs"));
  RETURN_IF_ERROR(scratch.allocate(device_scratch_bytes(shape.m), "the measurement's scratch"));
  ASSIGN_OR_RETURN(std::unique_ptr<CallTimer> timer, CallTimer::create());
  cudaStream_t stream = timer->stream();
  RETURN_IF_ERROR(fill_made_up_activations(x.get(), shape.x_dtype, x_count, stream));

  DeviceRunArgs args;
  args.x = x.get();
  args.x_dtype = shape.x_dtype;
  args.m = shape.m;
  args.y = y.get();
  args.y_dtype = shape.y_dtype;
  return time_measured_calls(
      *timer, cold, [&](cudaStream_t s) { return run_device(args, scratch.get(), s, nullptr); });
}

}  // namespace qlinear::gpu
