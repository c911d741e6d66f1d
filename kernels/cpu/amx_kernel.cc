#include "kernels/cpu/amx_kernel.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/cpu/cpu_support.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vnni_pack.h"
#include "kernels/cpu/work_split.h"
#if QLINEAR_HAVE_AMX
#include "kernels/cpu/amx_gemm.h"
#include "kernels/cpu/quantize_avx512.h"
#endif

namespace qlinear::cpu {

absl::Status amx_supported(const HostInfo& host) { return amx_isa_status(host); }

#if QLINEAR_HAVE_AMX
namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Tasks per thread: as cpu.avx512_vnni's (VnniTuning::tasks_per_thread), the last task bounds
// the imbalance between threads and the number of tasks the claiming overhead.
constexpr int64_t kTasksPerThread = 16;
// Quantize rows on several threads only when there is enough of it to repay the hand-off.
constexpr int64_t kParallelQuantizeMinElems = int64_t{1} << 15;

class AmxPrepared final : public MeasuredCpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<PreparedKernel>> create(const LayerWeights& w) {
    std::unique_ptr<AmxPrepared> p(new AmxPrepared(w));
    const LayerConfig& c = w.config;
    p->k_pad_ = round_up(c.k, kAmxKStep);
    p->n_pad_ = round_up(c.n, 16);
    p->panels_ = (p->n_pad_ + kVnniPanel - 1) / kVnniPanel;
    const size_t packed_bytes = static_cast<size_t>(p->n_pad_) * static_cast<size_t>(p->k_pad_);
    p->packed_ = allocate_buffer(packed_bytes);
    p->comp_ = allocate_buffer(static_cast<size_t>(p->n_pad_) * 4);
    if (p->packed_ == nullptr || p->comp_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu.amx: cannot allocate ", packed_bytes, " bytes for packed weights"));
    }
    pack_panels_on_pool(ThreadPool::global(), p->panels_, [&](int64_t p0, int64_t p1) {
      pack_weights_vnni(w.w.data(), c.n, c.k, p->k_pad_, p->n_pad_,
                        reinterpret_cast<int8_t*>(p->packed_.get()),
                        reinterpret_cast<int32_t*>(p->comp_.get()), p0, p1);
    });
    p->bias_ = round_bias(w);
    p->extra_bytes_ = static_cast<int64_t>(packed_bytes) + 4 * p->n_pad_ + p->bias_.bytes();
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

    // Per-thread scratch: xu [M, k_pad], sa [M], azp [M].
    thread_local ScratchBuffer scratch;
    absl::Cleanup trim = [] { scratch.release_if_larger(kKeepScratchBytes); };
    const size_t xu_bytes = static_cast<size_t>(round_up(m * k_pad_, 64));
    uint8_t* buf = scratch.get(xu_bytes + static_cast<size_t>(8 * m));
    if (buf == nullptr) {
      return absl::ResourceExhaustedError("cpu.amx: cannot allocate activation scratch");
    }
    auto* xu = buf;
    auto* sa = reinterpret_cast<float*>(buf + xu_bytes);
    auto* azp = reinterpret_cast<int32_t*>(buf + xu_bytes + 4 * m);

    const int64_t t0 = now_ns();
    QuantizeArgs q = quantize_args_for(c, args, sa, azp);
    q.xq = reinterpret_cast<int8_t*>(xu);
    q.xq_stride = k_pad_;
    q.shift_to_u8 = true;
    const int64_t bad_row = quantize_rows_on_pool(
        pool, m, m * c.k >= kParallelQuantizeMinElems,
        [&](int64_t r0, int64_t r1) { return quantize_rows_avx512(q, r0, r1); });
    if (bad_row >= 0) return non_finite_row_error(args.x, args.x_dtype, c.k, bad_row);
    const int64_t t1 = now_ns();

    VnniGemmArgs g;
    g.packed = reinterpret_cast<const int8_t*>(packed_.get());
    g.comp = reinterpret_cast<const int32_t*>(comp_.get());
    g.n = c.n;
    g.k_pad = k_pad_;
    g.n_pad = n_pad_;
    g.xu = xu;
    g.ldx = k_pad_;
    g.epi = epilogue_args_for(weights_, bias_, args, sa, azp);

    const GemmSplit split(m, panels_, kAmxRows, kAmxMaxRows, pool.threads(), kTasksPerThread);
    if (!run_gemm_tasks(pool, split, kAmxRows * kVnniPanel * 4,
                        [&](const GemmSplit::Range& r, int32_t* tile) {
                          gemm_u8s8_amx(g, r.r0, r.r1, r.p0, r.p1, tile);
                        })) {
      return absl::ResourceExhaustedError("cpu.amx: cannot allocate accumulator scratch");
    }
    const int64_t t2 = now_ns();

    finish_call(c, args, sa, azp, t0, t1, t2, timings);
    return absl::OkStatus();
  }

 private:
  explicit AmxPrepared(const LayerWeights& w) : weights_(w) {}

  const LayerWeights& weights_;
  int64_t k_pad_ = 0, n_pad_ = 0, panels_ = 0;
  std::unique_ptr<uint8_t[], FreeDeleter> packed_;
  std::unique_ptr<uint8_t[], FreeDeleter> comp_;
  RoundedBias bias_;
  int64_t extra_bytes_ = 0;
};

}  // namespace
#endif  // QLINEAR_HAVE_AMX

namespace {

class AmxKernel final : public Kernel {
 public:
  absl::string_view name() const override { return "cpu.amx"; }
  absl::Status is_supported(const HostInfo& host) const override { return amx_supported(host); }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    // Every scheme, dtype and shape: tails in M, N and K are handled, not refused.
    if (config.k > kMaxK) {
      return absl::InvalidArgumentError(absl::StrCat("K=", config.k, " exceeds ", kMaxK));
    }
    if (shape.m < 1) return absl::InvalidArgumentError("M must be >= 1");
    return absl::OkStatus();
  }
  // From M = 2: a tile multiplies 16 rows whatever the call holds, and at M = 1 the weights'
  // stream bounds every CPU kernel. Measured with bench/cpu/qlinear_cpu_bench --quick on a
  // 2-core Intel Xeon with AMX (weights rotated past the L3; time of cpu.onednn, which runs AMX
  // there too, over this kernel's, same run; docs/kernels.md, "The AMX kernel"):
  //   (6144, 4096): M = 1 0.93, 16 1.28, 64 1.24, 256 1.19, 1024 1.16
  //   (4096, 4096): M = 1 1.20, 16 1.43, 64 1.26, 256 1.24, 1024 1.12
  // where cpu.avx512_vnni was 1.04-1.14 at M = 16 and 0.44-0.71 from M = 64. So it comes first
  // in the priority order from M = 2; autotune still measures it on each layer and host.
  MRange preferred_m() const override { return MRange{2}; }
  // Its packed copy of the weights: about N x K bytes (padded).
  int64_t host_bytes_to_prepare(const LayerConfig& config) const override {
    return config.n * config.k;
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
#if QLINEAR_HAVE_AMX
    RETURN_IF_ERROR(amx_supported(host_info()));
    return AmxPrepared::create(weights);
#else
    (void)weights;
    return amx_supported(host_info());
#endif
  }
};

}  // namespace

std::unique_ptr<Kernel> make_amx_kernel() { return std::make_unique<AmxKernel>(); }

}  // namespace qlinear::cpu
