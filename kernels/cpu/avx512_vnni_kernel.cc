#include "kernels/cpu/avx512_vnni_kernel.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/cpu/cpu_support.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/work_split.h"
#if QLINEAR_HAVE_AVX512_VNNI
#include "kernels/cpu/avx512_vnni_gemm.h"
#include "kernels/cpu/quantize_avx512.h"
#endif
#if QLINEAR_HAVE_AMX
#include "kernels/cpu/amx_gemm.h"
#endif

namespace qlinear::cpu {

absl::Status avx512_vnni_supported(const HostInfo& host) { return avx512_vnni_isa_status(host); }

#if QLINEAR_HAVE_AVX512_VNNI
namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// VnniTuning's defaults, measured with bench/cpu/qlinear_cpu_bench:
// - prefetch_bytes: on a 2-core AMD EPYC (Zen 5) VM the hardware streamer does most of it (a
//   distance of 0, 1 or 4 KiB measured within +-3% at M = 1, all at 90-98% of the measured read
//   bandwidth); the prefetch is kept for CPUs with weaker streamers.
// - tasks_per_thread: 4 and 16 measured alike there (+-3%, M = 1..1024) on an idle machine; 16
//   degrades less when another process takes a core (dynamic claiming lets the other thread take
//   over its share).
// - whole_rows_min_panels, k_block, prefetch_next_block, stream_max_m: for M = 16..64 with
//   the weights from DRAM, on 16-thread Xeons (qlinear_cpu_bench --vnni-variants, ms at M = 16 on
//   4096 x 14336; docs/kernels.md, "CPU kernels", has every layer):
//     rows split in 3 tasks a panel (the split at larger M)          1.749
//     whole rows, K unblocked                                         0.872
//     whole rows, 1024-deep K blocks streaming the next into L2       0.793
//     whole rows, 512-deep blocks streaming the next (the default)    0.727
//     cpu.onednn                                                      1.098
//   and on another such host 256-, 384- and 512-deep blocks within 5% of each other in all but
//   one row (10%), 1024 1-16% slower, each tile prefetching its own weights instead of the next
//   block 12-31% slower. A 2-thread host never split rows at these M (every layer has over 32
//   panels); the blocks are not measured on the Zen 5 below.
// - stream_max_m 128, block_max_m 256: at M = 128 whole rows and blocks took 1.05-1.57x less time
//   than neither, at M = 256 blocks with rows split 0.96-1.24x; at M = 1024 blocks were slower on
//   three of four layers (docs/kernels.md, "Past M = 64").
//
// cpu.amx runs the same class with PanelGemm::kAmx: K padded to 64 so that its tiles take whole
// k-steps, x quantized into A tiles, and amx_gemm's tiles in place of the register tiles (the
// streaming and blocking settings above are the VNNI GEMM's and do not apply to it; its tasks per
// thread are its own, amx_kernel.cc).
class PanelPrepared final : public MeasuredCpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<PreparedKernel>> create(const LayerWeights& w,
                                                                const VnniTuning& tuning,
                                                                PanelGemm gemm) {
    std::unique_ptr<PanelPrepared> p(new PanelPrepared(w, tuning, gemm));
    const LayerConfig& c = w.config;
    p->k_pad_ = round_up(c.k, gemm == PanelGemm::kAmx ? 64 : 4);
    p->n_pad_ = round_up(c.n, 16);
    p->panels_ = (p->n_pad_ + kVnniPanel - 1) / kVnniPanel;
    p->ldx_ = round_up(p->k_pad_, 64);
    const size_t packed_bytes = static_cast<size_t>(p->n_pad_) * static_cast<size_t>(p->k_pad_);
    p->packed_ = allocate_buffer(packed_bytes);
    p->comp_ = allocate_buffer(static_cast<size_t>(p->n_pad_) * 4);
    if (p->packed_ == nullptr || p->comp_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat(p->name(), ": cannot allocate ", packed_bytes, " bytes for packed weights"));
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
    const int threads = pool.threads();

    // Per-thread scratch: xu [M, ldx], sa [M], azp [M].
    thread_local ScratchBuffer scratch;
    absl::Cleanup trim = [] { scratch.release_if_larger(kKeepScratchBytes); };
    // (cpu.amx's xu is in tiles of 16 rows: the last one whole.)
    const int64_t xu_rows = gemm_ == PanelGemm::kAmx ? round_up(m, 16) : m;
    const size_t xu_bytes = static_cast<size_t>(round_up(xu_rows * ldx_, 64));
    uint8_t* buf = scratch.get(xu_bytes + static_cast<size_t>(8 * m));
    if (buf == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name(), ": cannot allocate activation scratch"));
    }
    auto* xu = buf;
    auto* sa = reinterpret_cast<float*>(buf + xu_bytes);
    auto* azp = reinterpret_cast<int32_t*>(buf + xu_bytes + 4 * m);

    const int64_t t0 = now_ns();
    QuantizeArgs q = quantize_args_for(c, args, sa, azp);
    q.xq = reinterpret_cast<int8_t*>(xu);
    q.xq_stride = ldx_;
    q.shift_to_u8 = true;
    q.xq_tiles = gemm_ == PanelGemm::kAmx;
    const int64_t bad_row = quantize_rows_on_pool(
        pool, m, m * c.k >= tuning_.parallel_quantize_min_elems,
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
    g.ldx = ldx_;
    const bool stream = m <= tuning_.stream_max_m;
    const bool blocks = m <= tuning_.block_max_m;
    g.prefetch_bytes = stream ? tuning_.prefetch_bytes : 0;
    g.k_block = blocks ? tuning_.k_block : 0;
    g.prefetch_next_block = blocks && tuning_.prefetch_next_block;
    g.epi = epilogue_args_for(weights_, bias_, args, sa, azp);

    bool scratch_ok = false;
    if (gemm_ == PanelGemm::kAmx) {
#if QLINEAR_HAVE_AMX
      // One row tile (M <= 16) streams the weights: more, smaller tasks spread the stream.
      const GemmSplit split(m, panels_, kAmxRows, kAmxMaxRows, threads,
                            m <= kAmxRows ? kAmxStreamTasksPerThread : tuning_.tasks_per_thread);
      scratch_ok = run_gemm_tasks(pool, split, kAmxScratchBytes,
                                  [&](const GemmSplit::Range& r, int32_t* tile) {
                                    gemm_u8s8_amx(g, r.r0, r.r1, r.p0, r.p1, tile);
                                  });
#endif
    } else {
      const GemmSplit split(m, panels_, kVnniMr, kVnniMaxRows, threads, tuning_.tasks_per_thread,
                            stream ? tuning_.whole_rows_min_panels : 0);
      scratch_ok = run_gemm_tasks(pool, split, kVnniMaxRows * kVnniPanel * 4,
                                  [&](const GemmSplit::Range& r, int32_t* acc) {
                                    gemm_u8s8_vnni_avx512(g, r.r0, r.r1, r.p0, r.p1, acc);
                                  });
    }
    if (!scratch_ok) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name(), ": cannot allocate accumulator scratch"));
    }
    const int64_t t2 = now_ns();

    finish_call(c, args, sa, azp, t0, t1, t2, timings);
    return absl::OkStatus();
  }

 private:
  PanelPrepared(const LayerWeights& w, const VnniTuning& tuning, PanelGemm gemm)
      : weights_(w), tuning_(tuning), gemm_(gemm) {}
  const char* name() const { return gemm_ == PanelGemm::kAmx ? "cpu.amx" : "cpu.avx512_vnni"; }

  const LayerWeights& weights_;
  const VnniTuning tuning_;
  const PanelGemm gemm_;
  int64_t k_pad_ = 0, n_pad_ = 0, panels_ = 0, ldx_ = 0;
  std::unique_ptr<uint8_t[], FreeDeleter> packed_;
  std::unique_ptr<uint8_t[], FreeDeleter> comp_;
  RoundedBias bias_;
  int64_t extra_bytes_ = 0;
};

}  // namespace
#endif  // QLINEAR_HAVE_AVX512_VNNI

absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare_panels(const LayerWeights& weights,
                                                               const VnniTuning& tuning,
                                                               PanelGemm gemm) {
#if QLINEAR_HAVE_AVX512_VNNI
#if !QLINEAR_HAVE_AMX
  if (gemm == PanelGemm::kAmx) return amx_isa_status(host_info());
#endif
  return PanelPrepared::create(weights, tuning, gemm);
#else
  (void)weights;
  (void)tuning;
  (void)gemm;
  return avx512_vnni_isa_status(host_info());
#endif
}

namespace {

class Avx512VnniKernel final : public Kernel {
 public:
  explicit Avx512VnniKernel(const VnniTuning& tuning) : tuning_(tuning) {}
  absl::string_view name() const override { return "cpu.avx512_vnni"; }
  absl::Status is_supported(const HostInfo& host) const override {
    return avx512_vnni_supported(host);
  }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    // Every scheme, dtype and shape: tails in M, N and K are handled, not refused.
    if (config.k > kMaxK) {
      return absl::InvalidArgumentError(absl::StrCat("K=", config.k, " exceeds ", kMaxK));
    }
    if (shape.m < 1) return absl::InvalidArgumentError("M must be >= 1");
    return absl::OkStatus();
  }
  // Every M bucket. Measured with bench/cpu/qlinear_cpu_bench on a 2-core AMD EPYC (Zen 5) VM,
  // Llama-3-8B shapes, time of cpu.onednn / time of this kernel in the same run:
  //   M = 1: 1.00-1.09 (both at 90-98% of the measured DRAM read bandwidth)
  //   M = 4..64: 0.97-1.14;  M = 256, 1024: 0.96-1.07 (K = 14336, M = 1024 is the low end)
  // so this kernel comes first in the priority order and cpu.onednn after it. On a 16-thread Intel
  // Xeon with AVX-512 VNNI (a GPU host), the same four layers and weights rotated past the L3:
  //   M = 1: 1.49-1.87;  M = 16, 64: 1.23-1.75;  and in later runs M = 128: 1.03-1.73,
  //   M = 256: 0.77-1.91 (ahead or behind by layer and run)
  // so there neither is the better choice at every M: autotune measures both on each layer and
  // host (docs/kernels.md, "CPU kernels"), and the order decides only with --autotune=false.
  MRange preferred_m() const override { return MRange{}; }
  // Its packed copy of the weights: about N x K bytes (padded).
  int64_t host_bytes_to_prepare(const LayerConfig& config) const override {
    return config.n * config.k;
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
#if QLINEAR_HAVE_AVX512_VNNI
    RETURN_IF_ERROR(avx512_vnni_supported(host_info()));
    return prepare_panels(weights, tuning_, PanelGemm::kVnni);
#else
    (void)weights;
    return avx512_vnni_supported(host_info());
#endif
  }

 private:
  const VnniTuning tuning_;
};

}  // namespace

std::unique_ptr<Kernel> make_avx512_vnni_kernel() { return make_avx512_vnni_kernel(VnniTuning{}); }

std::unique_ptr<Kernel> make_avx512_vnni_kernel(const VnniTuning& tuning) {
  return std::make_unique<Avx512VnniKernel>(tuning);
}

}  // namespace qlinear::cpu
