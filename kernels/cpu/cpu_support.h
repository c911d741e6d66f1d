// Shared glue of the CPU kernel families (generic code, no ISA flags): aligned buffers for packed
// weights and per-call scratch, the bias rounded per output dtype, and the non-finite input error.
//
// Packed weights are streamed from DRAM at every small-M call, so they live in 2 MiB-aligned
// memory that the kernel is asked to back with transparent huge pages (madvise): with 4 KiB pages
// a weight stream of hundreds of MiB walks a new page (and, in a VM, a nested page walk) every
// 4 KiB. Where THP is off, the advice is ignored and the buffer is an ordinary aligned one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/core/host_info.h"
#include "kernels/core/kernel.h"
#include "kernels/core/layer.h"
#include "kernels/cpu/epilogue_args.h"
#include "kernels/cpu/quantize_args.h"

namespace qlinear::cpu {

struct FreeDeleter {
  void operator()(void* p) const;
};

// An owned, zero-initialized buffer of `bytes` bytes aligned to `alignment` (a power of two >= 64).
// Buffers of 2 MiB or more are aligned to 2 MiB and advised to use huge pages. Returns null when
// memory is exhausted.
std::unique_ptr<uint8_t[], FreeDeleter> allocate_buffer(size_t bytes, size_t alignment = 64);

// A buffer that grows on demand and is reused across calls by one thread (per-call scratch).
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer();
  // Returns at least `bytes` bytes aligned to 64, or null when memory is exhausted. Invalidates
  // earlier pointers.
  uint8_t* get(size_t bytes);
  // Frees the buffer if it holds more than `bytes`, so that one very large call does not pin its
  // scratch in every thread that served it. A kernel calls it on every way out of a call, failed
  // ones included (an absl::Cleanup beside the buffer).
  void release_if_larger(size_t bytes);

 private:
  std::unique_ptr<uint8_t[], FreeDeleter> data_;
  size_t size_ = 0;
};

// OK when this binary holds the AVX-512 code of kernels/cpu (quantize_avx512, epilogue_avx512,
// avx512_vnni_gemm) and the host has avx512f, avx512bw, avx512vl and avx512_vnni; otherwise the
// reason, for users. Nothing in those files may run before this passed.
absl::Status avx512_vnni_isa_status(const HostInfo& host);

// OK when this binary holds the AVX2 code of kernels/cpu (quantize_avx2, epilogue_avx2,
// avx2_gemm) and the host has avx2, fma and f16c; otherwise the reason, for users. Nothing in
// those files may run before this passed.
absl::Status avx2_isa_status(const HostInfo& host);

// OK when this binary holds the AMX code of kernels/cpu (amx_gemm) and the AVX-512 code, the host
// passes avx512_vnni_isa_status and has AMX-INT8, and Linux gave this process the AMX tiles'
// state (asked once, process-wide: arch_prctl ARCH_REQ_XCOMP_PERM); otherwise the reason, for
// users. Nothing in amx_gemm may run before this passed.
absl::Status amx_isa_status(const HostInfo& host);

// The layer's bias rounded to each output dtype and widened back (`bias_f` of SPEC section 4),
// indexed by DType; empty when the layer has no bias.
struct RoundedBias {
  std::vector<float> f32, f16, bf16;
  const float* get(DType t) const;  // null when the layer has no bias
  int64_t bytes() const {
    return static_cast<int64_t>(4 * (f32.size() + f16.size() + bf16.size()));
  }
};
RoundedBias round_bias(const LayerWeights& weights);

// The fields of QuantizeArgs that the layer and the call give (scheme, input scale and zero point,
// x, its dtype, K), with sa and azp written to the given buffers. The caller sets where xq goes,
// its stride and its form.
QuantizeArgs quantize_args_for(const LayerConfig& config, const RunArgs& args, float* sa,
                               int32_t* azp);

// The fields of EpilogueArgs that the layer and the call give: the scheme, sb, the bias rounded to
// the output dtype, azp_adj (asymmetric schemes), the rows' sa and azp, and y. comp stays null.
EpilogueArgs epilogue_args_for(const LayerWeights& weights, const RoundedBias& bias,
                               const RunArgs& args, const float* sa, const int32_t* azp);

// A steady-clock time stamp in ns, for RunTimings.
int64_t now_ns();

// The end of a call: copies the rows' sa, and azp for asymmetric schemes, to the call's buffers
// where it asked for them, and fills `timings` (when given) from the stamps taken at the call's
// start (t0), after the quantization (t1) and after the GEMM and epilogue (t2).
void finish_call(const LayerConfig& config, const RunArgs& args, const float* sa,
                 const int32_t* azp, int64_t t0, int64_t t1, int64_t t2, RunTimings* timings);

// The INVALID_ARGUMENT that reference::quantize_activations returns for `row` of x, word for word
// (row must hold a non-finite value).
absl::Status non_finite_row_error(const void* x, DType x_dtype, int64_t k, int64_t row);

// The size in bytes of the host's last-level cache (the largest cache level the kernel reports for
// CPU 0 under /sys/devices/system/cpu/cpu0/cache), or 0 where it reports none.
int64_t last_level_cache_bytes();

// How measure_call_us prepares each timed call. Autotune's form is MeasuredCpuKernel::measure_us's;
// the CPU benchmark also times the others, to show what each does to the ranking.
struct MeasureOptions {
  // Empty the caches first: a read of kEvictLlcTimes the last-level cache (at most
  // kEvictMaxBytes, on the thread pool), so that the weights come from memory as they do for a
  // served model, whose layers together far exceed the caches (where the buffer cannot be had,
  // the weights stay where the previous call left them).
  bool empty_caches = true;
  // Then wait until the thread pool's workers sleep (at most kMeasureAsleepWaitUs). Autotune does
  // so for a kernel that runs on threads of its own (cpu.onednn's OpenMP team), so that no worker
  // of ours, polling for a while after the emptying pass, takes a core from that team; a kernel
  // on the pool starts, as in serving, with its workers polling. Without the wait, and with
  // OpenMP's default spin (see apply_openmp_spin_default in onednn_gemm.h), cpu.onednn measured
  // 2.3-4.3x the time it served on 6144 x 4096 on a 16-thread Xeon (AVX-512 VNNI, 300 MiB of L3),
  // up to 19 ms a call on 4096 x 4096 at M = 64, and autotune kept cpu.avx512_vnni where
  // cpu.onednn served 1.3-1.4x faster (docs/kernels.md, "CPU kernels" under "Autotune").
  bool wait_pool_asleep = false;
  // After the emptying pass (and before the wait above), flush these bytes from every cache
  // level (CLFLUSH, on the thread pool): the kernel's weights. The emptying pass alone does not
  // reach memory everywhere: on a 16-thread Xeon (300 MiB of L3) cpu.avx512_vnni measured 0.31-0.35
  // ms at M = 16 on 6144 x 4096 after it, as with its weights in the L3 (0.26-0.32), where rotating
  // past the L3 took 0.74-0.93 ms (likely an L3 that keeps lines it saw reused through a stream
  // read once). With the flush the load's times came within 10% of the rotation's (docs/kernels.md,
  // "CPU kernels" under "Autotune").
  absl::Span<const uint8_t> flush;
};

// Autotune's measurement of a CPU kernel (PreparedKernel::measure_us): `kernel` (prepared for a
// layer of `config`) runs `shape` on random activations of the shape's dtypes, once untimed and
// then timed call after call on the steady clock until it has kMeasureMaxCalls calls, or at least
// kMeasureMinCalls and kMeasureEnoughNs of calls, or kMeasureMaxNs in all; the median in
// microseconds. Each timed call is prepared as `options` says. A failed call is the
// measurement's status.
absl::StatusOr<double> measure_call_us(const PreparedKernel& kernel, const LayerConfig& config,
                                       const ProblemShape& shape,
                                       const MeasureOptions& options = {});
inline constexpr int kMeasureMaxCalls = 25;
inline constexpr int kMeasureMinCalls = 3;
inline constexpr int64_t kMeasureEnoughNs = 30'000'000;
inline constexpr int64_t kMeasureMaxNs = 200'000'000;
inline constexpr int64_t kEvictLlcTimes = 2;
inline constexpr int64_t kEvictMaxBytes = int64_t{1} << 30;
// The CPU kernels' measure_margin: another CPU kernel must measure more than 5% faster to rank
// ahead of the one the priority order puts first. Measured on the H200 host's Xeon, the kernels
// that stream the weights at M = 1 (cpu.avx512_vnni, cpu.avx2) came within 0.4-3.5% of each other
// on 4096 x 14336 and 28672 x 4096 layers, where serving could not tell them apart.
inline constexpr double kMeasureMargin = 0.05;
// The CPU kernels' max_measured_m: larger buckets are measured at this M, where the kernels are
// bound by their multiplies as at larger M, and a call on a large layer still takes about a second
// on a small host (8192 x 28672 at M = 256: about 1.5 s for cpu.avx2 on 2 Zen 2 cores; 12 s at
// M = 2048).
inline constexpr int64_t kMeasureMaxM = 256;
inline constexpr int64_t kMeasureAsleepWaitUs = 5000;

// Whether the process holds the buffer of measure_call_us's emptying pass (for tests): the
// measurements share it, and it is freed about 2 s after the last one ends.
bool measurement_buffer_held_for_testing();

// The bytes the calling thread's ScratchBuffers hold now (tests: what a call leaves behind).
size_t thread_scratch_bytes_for_testing();

// A CPU kernel's prepared state, as autotune measures it (measure_call_us, kMeasureMaxM,
// kMeasureMargin): each CPU family's PreparedKernel derives from it.
class MeasuredCpuKernel : public PreparedKernel {
 public:
  absl::StatusOr<double> measure_us(const ProblemShape& shape) const override {
    MeasureOptions options;
    options.wait_pool_asleep = !runs_on_thread_pool();
    options.flush = weight_memory();
    return measure_call_us(*this, layer_config(), shape, options);
  }
  int64_t max_measured_m() const override { return kMeasureMaxM; }
  double measure_margin() const override { return kMeasureMargin; }
  // Whether its calls run on ThreadPool::global() (else on threads of their own).
  virtual bool runs_on_thread_pool() const { return true; }
  // Its prepared weights, which a served model's next call on the layer finds in memory:
  // autotune flushes them from the caches before each timed call (MeasureOptions::flush).
  virtual absl::Span<const uint8_t> weight_memory() const { return {}; }

 protected:
  virtual const LayerConfig& layer_config() const = 0;
};

// Per-thread scratch above this size is freed after the call that needed it.
inline constexpr size_t kKeepScratchBytes = size_t{64} << 20;

}  // namespace qlinear::cpu
