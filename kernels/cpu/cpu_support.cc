#include "kernels/cpu/cpu_support.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/steady_clock.h"
#include "kernels/core/dtype.h"
#include "kernels/core/status.h"
#include "kernels/cpu/thread_pool.h"

namespace qlinear::cpu {

void FreeDeleter::operator()(void* p) const { std::free(p); }

std::unique_ptr<uint8_t[], FreeDeleter> allocate_buffer(size_t bytes, size_t alignment) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const bool huge = bytes >= kHugePage;
  if (huge) alignment = kHugePage;
  if (alignment < 64) alignment = 64;
  // aligned_alloc wants a multiple of the alignment.
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (p == nullptr) return nullptr;
#ifdef MADV_HUGEPAGE
  if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice only; failure is harmless
#endif
  std::memset(p, 0, rounded);
  return std::unique_ptr<uint8_t[], FreeDeleter>(static_cast<uint8_t*>(p));
}

namespace {
// What this thread's ScratchBuffers hold (each buffer is used by one thread only).
thread_local size_t t_scratch_bytes = 0;
}  // namespace

ScratchBuffer::~ScratchBuffer() { t_scratch_bytes -= size_; }

uint8_t* ScratchBuffer::get(size_t bytes) {
  if (bytes > size_ || data_ == nullptr) {
    // Grow geometrically so that a slowly rising M does not reallocate every call.
    const size_t want = bytes > 2 * size_ ? bytes : 2 * size_;
    data_.reset();
    t_scratch_bytes -= size_;
    data_ = allocate_buffer(want);
    size_ = data_ == nullptr ? 0 : want;
    t_scratch_bytes += size_;
  }
  return data_.get();
}

void ScratchBuffer::release_if_larger(size_t bytes) {
  if (size_ > bytes) {
    data_.reset();
    t_scratch_bytes -= size_;
    size_ = 0;
  }
}

size_t thread_scratch_bytes_for_testing() { return t_scratch_bytes; }

absl::Status avx512_vnni_isa_status(const HostInfo& host) {
#if !QLINEAR_HAVE_AVX512_VNNI
  (void)host;
  return absl::FailedPreconditionError(
      "not compiled in (the compiler that built this binary lacks -mavx512vnni)");
#else
  std::vector<std::string> missing;
  if (!host.avx512f) missing.push_back("avx512f");
  if (!host.avx512bw) missing.push_back("avx512bw");
  if (!host.avx512vl) missing.push_back("avx512vl");
  if (!host.avx512_vnni) missing.push_back("avx512_vnni");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("needs AVX-512 VNNI; this CPU lacks ", absl::StrJoin(missing, ", ")));
  }
  return absl::OkStatus();
#endif
}

absl::Status amx_isa_status(const HostInfo& host) {
#if !QLINEAR_HAVE_AMX
  (void)host;
  return absl::FailedPreconditionError(
      "not compiled in (the compiler that built this binary lacks -mamx-int8, or AVX-512 VNNI)");
#else
  if (!host.amx_int8) {
    return absl::FailedPreconditionError("needs AMX-INT8; this CPU lacks amx_int8");
  }
  if (absl::Status s = avx512_vnni_isa_status(host); !s.ok()) return s;
  // The tiles' state is off in every process until it asks (Linux 5.16 and later); asked once.
  static const int asked = [] {
    constexpr int kArchReqXcompPerm = 0x1023;
    constexpr int kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0 ? 0 : errno;
  }();
  if (asked != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the OS did not give this process the AMX tiles' state (arch_prctl "
                     "ARCH_REQ_XCOMP_PERM: ",
                     std::strerror(asked), "; Linux 5.16 or later is needed)"));
  }
  return absl::OkStatus();
#endif
}

absl::Status avx2_isa_status(const HostInfo& host) {
#if !QLINEAR_HAVE_AVX2
  (void)host;
  return absl::FailedPreconditionError(
      "not compiled in (the compiler that built this binary lacks -mavx2 -mfma -mf16c)");
#else
  std::vector<std::string> missing;
  if (!host.avx2) missing.push_back("avx2");
  if (!host.fma) missing.push_back("fma");
  if (!host.f16c) missing.push_back("f16c");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("needs AVX2, FMA and F16C; this CPU lacks ", absl::StrJoin(missing, ", ")));
  }
  return absl::OkStatus();
#endif
}

const float* RoundedBias::get(DType t) const {
  const std::vector<float>& v = t == DType::kF32 ? f32 : t == DType::kF16 ? f16 : bf16;
  return v.empty() ? nullptr : v.data();
}

RoundedBias round_bias(const LayerWeights& weights) {
  RoundedBias b;
  if (!weights.config.has_bias) return b;
  for (float v : weights.bias) {
    b.f32.push_back(round_to_dtype(v, DType::kF32));
    b.f16.push_back(round_to_dtype(v, DType::kF16));
    b.bf16.push_back(round_to_dtype(v, DType::kBF16));
  }
  return b;
}

QuantizeArgs quantize_args_for(const LayerConfig& config, const RunArgs& args, float* sa,
                               int32_t* azp) {
  QuantizeArgs q;
  q.scheme = config.scheme;
  q.input_scale = config.input_scale;
  q.input_zero_point = config.input_zero_point;
  q.x = args.x;
  q.x_dtype = args.x_dtype;
  q.k = config.k;
  q.sa = sa;
  q.azp = azp;
  return q;
}

EpilogueArgs epilogue_args_for(const LayerWeights& weights, const RoundedBias& bias,
                               const RunArgs& args, const float* sa, const int32_t* azp) {
  const LayerConfig& c = weights.config;
  EpilogueArgs e;
  e.scheme = c.scheme;
  e.sb = weights.sb.data();
  e.bias_f = bias.get(args.y_dtype);
  e.azp_adj = is_asymmetric(c.scheme) ? weights.azp_adj.data() : nullptr;
  e.sa = sa;
  e.azp = azp;
  e.y = args.y;
  e.y_dtype = args.y_dtype;
  e.ldy = c.n;
  return e;
}

int64_t now_ns() { return steady_now_ns(); }

int64_t last_level_cache_bytes() {
  int64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream in(absl::StrCat("/sys/devices/system/cpu/cpu0/cache/index", i, "/size"));
    std::string s;
    if (!(in >> s) || s.empty()) continue;
    int64_t mult = 1;
    if (s.back() == 'K') {
      mult = 1024;
      s.pop_back();
    } else if (s.back() == 'M') {
      mult = 1024 * 1024;
      s.pop_back();
    }
    int64_t v = 0;
    if (absl::SimpleAtoi(s, &v)) best = std::max(best, v * mult);
  }
  return best;
}

namespace {

// The cache-emptying pass's buffer, shared by the measurements of a process and kept between them:
// allocating and touching it (600 MiB on a CPU with 300 MiB of L3) cost 100-200 ms, about as
// much as one measurement's calls, and a layer's load makes up to a dozen measurements. It is
// freed once no measurement has held it for kEvictKeep (a reaper thread waits for that), so
// that a server that has loaded its layers does not keep it.
constexpr auto kEvictKeep = std::chrono::milliseconds(2000);

class EvictionBuffers {
 public:
  static EvictionBuffers& global() {
    static EvictionBuffers* b = new EvictionBuffers;  // never destroyed: the reaper may be waiting
    return *b;
  }

  // Gives the buffer back (release()) when it goes.
  struct Releaser {
    void operator()(const uint8_t*) const { global().release(); }
  };
  using Lease = std::unique_ptr<const uint8_t, Releaser>;

  // kEvictLlcTimes the last-level cache, at most kEvictMaxBytes (0 where the host reports none).
  size_t bytes() const { return bytes_; }

  // The buffer, touched, for one measurement until the lease goes; null where there is none (no
  // last-level cache reported, or memory exhausted).
  Lease acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (buf_ == nullptr && bytes_ > 0) buf_ = allocate_buffer(bytes_);
    if (buf_ == nullptr) return nullptr;
    ++users_;
    last_use_ = std::chrono::steady_clock::now();
    if (!reaper_running_) {
      try {
        std::thread([this] { reap(); }).detach();
        reaper_running_ = true;
      } catch (const std::system_error&) {
        // No thread: the buffer is freed when this measurement ends (release()).
      }
    }
    return Lease(buf_.get());
  }

  bool holds_buffer() {
    std::lock_guard<std::mutex> lock(mu_);
    return buf_ != nullptr;
  }

 private:
  EvictionBuffers()
      : bytes_(static_cast<size_t>(
            std::min(kEvictMaxBytes, kEvictLlcTimes * last_level_cache_bytes()))) {}

  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    --users_;
    last_use_ = std::chrono::steady_clock::now();
    if (users_ == 0 && !reaper_running_) buf_ = nullptr;
  }

  void reap() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      const auto due = last_use_ + kEvictKeep;
      if (users_ == 0 && std::chrono::steady_clock::now() >= due) {
        buf_ = nullptr;
        reaper_running_ = false;
        return;
      }
      lock.unlock();
      std::this_thread::sleep_until(
          std::max(due, std::chrono::steady_clock::now() + kEvictKeep / 8));
      lock.lock();
    }
  }

  std::mutex mu_;
  const size_t bytes_;
  std::unique_ptr<uint8_t[], FreeDeleter> buf_;
  int users_ = 0;  // measurements between acquire() and release()
  std::chrono::steady_clock::time_point last_use_;
  bool reaper_running_ = false;
};

// Reads every cache line of buf[0, bytes) on the thread pool: what the next call reads then
// comes from memory.
void evict_caches(const uint8_t* buf, size_t bytes) {
  static std::atomic<uint64_t> sink{0};
  ThreadPool& pool = ThreadPool::global();
  const int64_t tasks = 4 * static_cast<int64_t>(pool.threads());
  const size_t chunk = (bytes / static_cast<size_t>(tasks) + 63) / 64 * 64;
  pool.parallel_for(tasks, [&](int64_t t) {
    const size_t begin = std::min(bytes, static_cast<size_t>(t) * chunk);
    const size_t end = std::min(bytes, begin + chunk);
    uint64_t acc = 0;
    for (size_t i = begin; i + 8 <= end; i += 64) {
      uint64_t v;
      std::memcpy(&v, buf + i, 8);
      acc ^= v;
    }
    sink.fetch_xor(acc, std::memory_order_relaxed);  // keeps the reads
  });
}

// Flushes every cache line of `bytes` from every cache level, on the thread pool (CLFLUSH is
// part of SSE2, so of every x86-64 CPU; elsewhere the bytes stay where they are).
void flush_caches(absl::Span<const uint8_t> bytes) {
#if defined(__x86_64__)
  if (bytes.empty()) return;
  const uintptr_t first = reinterpret_cast<uintptr_t>(bytes.data()) & ~uintptr_t{63};
  const uintptr_t end = reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size();
  const int64_t lines = static_cast<int64_t>((end - first + 63) / 64);
  ThreadPool& pool = ThreadPool::global();
  const int64_t tasks = std::min<int64_t>(lines, 4 * static_cast<int64_t>(pool.threads()));
  pool.parallel_for(tasks, [&](int64_t t) {
    for (int64_t l = lines * t / tasks; l < lines * (t + 1) / tasks; ++l) {
      _mm_clflush(reinterpret_cast<const void*>(first + 64 * static_cast<uintptr_t>(l)));
    }
    _mm_mfence();
  });
#else
  (void)bytes;
#endif
}

}  // namespace

bool measurement_buffer_held_for_testing() { return EvictionBuffers::global().holds_buffer(); }

absl::StatusOr<double> measure_call_us(const PreparedKernel& kernel, const LayerConfig& config,
                                       const ProblemShape& shape, const MeasureOptions& options) {
  if (shape.m < 1 || shape.n != config.n || shape.k != config.k) {
    return absl::InvalidArgumentError(absl::StrCat("cannot measure M=", shape.m, " N=", shape.n,
                                                   " K=", shape.k, " on a layer of N=", config.n,
                                                   " K=", config.k));
  }
  const size_t mk = static_cast<size_t>(shape.m * shape.k);
  std::vector<uint8_t> x(mk * dtype_size(shape.x_dtype));
  std::vector<uint8_t> y(static_cast<size_t>(shape.m * shape.n) * dtype_size(shape.y_dtype));
  std::vector<float> sa(static_cast<size_t>(shape.m));
  std::vector<int32_t> azp(static_cast<size_t>(shape.m));
  // Activations spread over [-2, 2), as a layer's inputs are after a normalization.
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < mk; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float v = static_cast<float>(static_cast<int32_t>(state >> 40) - (1 << 23)) / (1 << 22);
    store_from_f32(x.data(), shape.x_dtype, i, v);
  }
  RunArgs args;
  args.x = x.data();
  args.x_dtype = shape.x_dtype;
  args.m = shape.m;
  args.y = y.data();
  args.y_dtype = shape.y_dtype;
  args.sa = sa.data();
  args.azp = azp.data();
  // The eviction buffer (shared; zeroed when allocated, so its pages are touched before the
  // first read).
  EvictionBuffers& buffers = EvictionBuffers::global();
  const EvictionBuffers::Lease evict = options.empty_caches ? buffers.acquire() : nullptr;
  RETURN_IF_ERROR(kernel.run(args, nullptr));  // untimed: scratch and code in place
  std::vector<double> us;
  int64_t in_calls = 0;
  const int64_t start = now_ns();
  for (;;) {
    if (evict != nullptr) evict_caches(evict.get(), buffers.bytes());
    flush_caches(options.flush);
    if (options.wait_pool_asleep) {
      (void)ThreadPool::global().wait_until_asleep(std::chrono::microseconds(kMeasureAsleepWaitUs));
    }
    const int64_t t0 = now_ns();
    RETURN_IF_ERROR(kernel.run(args, nullptr));
    const int64_t t1 = now_ns();
    us.push_back(static_cast<double>(t1 - t0) / 1e3);
    in_calls += t1 - t0;
    const int n = static_cast<int>(us.size());
    if (n >= kMeasureMaxCalls || (n >= kMeasureMinCalls && in_calls >= kMeasureEnoughNs) ||
        t1 - start >= kMeasureMaxNs) {
      break;
    }
  }
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  return n % 2 == 1 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
}

void finish_call(const LayerConfig& config, const RunArgs& args, const float* sa,
                 const int32_t* azp, int64_t t0, int64_t t1, int64_t t2, RunTimings* timings) {
  if (args.sa != nullptr) std::copy(sa, sa + args.m, args.sa);
  if (args.azp != nullptr && is_asymmetric(config.scheme)) std::copy(azp, azp + args.m, args.azp);
  if (timings != nullptr) {
    timings->quantize_ns = t1 - t0;
    timings->gemm_ns = t2 - t1;
  }
}

absl::Status non_finite_row_error(const void* x, DType x_dtype, int64_t k, int64_t row) {
  for (int64_t col = 0; col < k; ++col) {
    const float v = load_as_f32(x, x_dtype, static_cast<size_t>(row * k + col));
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("x row ", row, " holds a non-finite value (", v, " at column ", col, ")"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("x row ", row, " holds a non-finite value"));
}

}  // namespace qlinear::cpu
