#include "kernels/cpu/avx2_kernel.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/cpu/cpu_support.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/work_split.h"
#if QLINEAR_HAVE_AVX2
#include "kernels/cpu/avx2_gemm.h"
#include "kernels/cpu/quantize_avx2.h"
#endif

namespace qlinear::cpu {

absl::Status avx2_supported(const HostInfo& host) { return avx2_isa_status(host); }

#if QLINEAR_HAVE_AVX2
namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Tuning of the work split, measured with bench/cpu/qlinear_cpu_bench on a 2-core AMD EPYC
// (Zen 2, AVX2 only) VM.
struct Tuning {
  // Up to this M the weights stream from DRAM once per call and the GEMM is memory-bound, so the
  // tiles prefetch the weights ahead of use.
  int64_t stream_max_m = 16;
  int64_t prefetch_bytes = 1024;
  // Tasks per thread: the last task bounds the imbalance between threads (a late-waking worker,
  // or a core taken by another process), the number of tasks bounds the claiming overhead.
  int64_t tasks_per_thread = 16;
  // Quantize rows on several threads only when there is enough of it to repay the hand-off.
  int64_t parallel_quantize_min_elems = int64_t{1} << 15;
};

constexpr Tuning kTuning;

class Avx2Prepared final : public MeasuredCpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<PreparedKernel>> create(const LayerWeights& w) {
    std::unique_ptr<Avx2Prepared> p(new Avx2Prepared(w));
    const LayerConfig& c = w.config;
    p->k_pad_ = round_up(c.k, 2);
    p->n_pad_ = round_up(c.n, 8);
    p->panels_ = (p->n_pad_ + kAvx2Panel - 1) / kAvx2Panel;
    p->ldx_ = round_up(p->k_pad_, 32);  // int16 rows on 64-byte boundaries
    const size_t packed_bytes = static_cast<size_t>(p->n_pad_) * static_cast<size_t>(p->k_pad_);
    p->packed_ = allocate_buffer(packed_bytes);
    if (p->packed_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu.avx2: cannot allocate ", packed_bytes, " bytes for packed weights"));
    }
    pack_panels_on_pool(ThreadPool::global(), p->panels_, [&](int64_t p0, int64_t p1) {
      pack_weights_avx2(w.w.data(), c.n, c.k, p->k_pad_, p->n_pad_,
                        reinterpret_cast<int8_t*>(p->packed_.get()), p0, p1);
    });
    p->bias_ = round_bias(w);
    p->extra_bytes_ = static_cast<int64_t>(packed_bytes) + p->bias_.bytes();
    return std::unique_ptr<PreparedKernel>(std::move(p));
  }

  int64_t extra_bytes() const override { return extra_bytes_; }
  absl::Span<const uint8_t> weight_memory() const override {
    return {packed_.get(), static_cast<size_t>(n_pad_ * k_pad_)};
  }
  // Which CPU kernel is fastest depends on the CPU: autotune measures it (cpu_support.h).
  const LayerConfig& layer_config() const override { return weights_.config; }

  absl::Status run(const RunArgs& args, RunTimings* timings) const override {
    const LayerConfig& c = weights_.config;
    const int64_t m = args.m;
    if (m < 1) return absl::InvalidArgumentError("M must be >= 1");
    ThreadPool& pool = ThreadPool::global();
    const int threads = pool.threads();

    // Per-thread scratch: x16 [M, ldx] int16, sa [M], azp [M].
    thread_local ScratchBuffer scratch;
    absl::Cleanup trim = [] { scratch.release_if_larger(kKeepScratchBytes); };
    const size_t x16_bytes = static_cast<size_t>(round_up(2 * m * ldx_, 64));
    uint8_t* buf = scratch.get(x16_bytes + static_cast<size_t>(8 * m));
    if (buf == nullptr) {
      return absl::ResourceExhaustedError("cpu.avx2: cannot allocate activation scratch");
    }
    auto* x16 = reinterpret_cast<int16_t*>(buf);
    auto* sa = reinterpret_cast<float*>(buf + x16_bytes);
    auto* azp = reinterpret_cast<int32_t*>(buf + x16_bytes + 4 * m);

    const int64_t t0 = now_ns();
    QuantizeArgs q = quantize_args_for(c, args, sa, azp);
    q.xq_stride = ldx_;
    const int64_t bad_row = quantize_rows_on_pool(
        pool, m, m * c.k >= kTuning.parallel_quantize_min_elems,
        [&](int64_t r0, int64_t r1) { return quantize_rows_avx2(q, x16, r0, r1); });
    if (bad_row >= 0) return non_finite_row_error(args.x, args.x_dtype, c.k, bad_row);
    const int64_t t1 = now_ns();

    Avx2GemmArgs g;
    g.packed = reinterpret_cast<const int8_t*>(packed_.get());
    g.n = c.n;
    g.k_pad = k_pad_;
    g.n_pad = n_pad_;
    g.x16 = x16;
    g.ldx = ldx_;
    g.prefetch_bytes = m <= kTuning.stream_max_m ? kTuning.prefetch_bytes : 0;
    g.epi = epilogue_args_for(weights_, bias_, args, sa, azp);

    const GemmSplit split(m, panels_, kAvx2Mr, kAvx2MaxRows, threads, kTuning.tasks_per_thread);
    if (!run_gemm_tasks(pool, split, kAvx2MaxRows * kAvx2Panel * 4,
                        [&](const GemmSplit::Range& r, int32_t* acc) {
                          gemm_s16s8_avx2(g, r.r0, r.r1, r.p0, r.p1, acc);
                        })) {
      return absl::ResourceExhaustedError("cpu.avx2: cannot allocate accumulator scratch");
    }
    const int64_t t2 = now_ns();

    finish_call(c, args, sa, azp, t0, t1, t2, timings);
    return absl::OkStatus();
  }

 private:
  explicit Avx2Prepared(const LayerWeights& w) : weights_(w) {}

  const LayerWeights& weights_;
  int64_t k_pad_ = 0, n_pad_ = 0, panels_ = 0, ldx_ = 0;
  std::unique_ptr<uint8_t[], FreeDeleter> packed_;
  RoundedBias bias_;
  int64_t extra_bytes_ = 0;
};

}  // namespace
#endif  // QLINEAR_HAVE_AVX2

namespace {

class Avx2Kernel final : public Kernel {
 public:
  absl::string_view name() const override { return "cpu.avx2"; }
  absl::Status is_supported(const HostInfo& host) const override { return avx2_supported(host); }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    // Every scheme, dtype and shape: tails in M, N and K are handled, not refused.
    if (config.k > kMaxK) {
      return absl::InvalidArgumentError(absl::StrCat("K=", config.k, " exceeds ", kMaxK));
    }
    if (shape.m < 1) return absl::InvalidArgumentError("M must be >= 1");
    return absl::OkStatus();
  }
  // Every M bucket: on the hosts it serves, the only other candidate is the scalar reference.
  MRange preferred_m() const override { return MRange{}; }
  // Its packed copy of the weights: about N x K bytes (padded).
  int64_t host_bytes_to_prepare(const LayerConfig& config) const override {
    return config.n * config.k;
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
#if QLINEAR_HAVE_AVX2
    RETURN_IF_ERROR(avx2_supported(host_info()));
    return Avx2Prepared::create(weights);
#else
    (void)weights;
    return avx2_supported(host_info());
#endif
  }
};

}  // namespace

std::unique_ptr<Kernel> make_avx2_kernel() { return std::make_unique<Avx2Kernel>(); }

}  // namespace qlinear::cpu
